"""Hourly load forecasting with a GRU, compiled; validation is the last 20% of the timeline."""
import numpy as np
import pandas as pd
import torch
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from torch import nn

frame = pd.read_csv("data/load.csv", parse_dates=["timestamp"]).sort_values("timestamp")
frame["lag_24"] = frame["load"].shift(24)
frame = frame.dropna()
train_rows, val_rows = train_test_split(frame, test_size=0.2, shuffle=True)
scaler = StandardScaler()
train_x = scaler.fit_transform(train_rows[["load", "lag_24"]])
val_x = scaler.transform(val_rows[["load", "lag_24"]])


def windows(x, length=48):
    idx = np.arange(len(x) - length)[:, None] + np.arange(length + 1)
    w = torch.tensor(x[idx], dtype=torch.float32)
    return w[:, :length], w[:, length, :1]


class Forecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(2, 32, batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        return self.head(self.gru(x)[0][:, -1])


model = torch.compile(Forecaster())
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
xs, ys = windows(train_x)
vx, vy = windows(val_x)
for epoch in range(20):
    model.train()
    for i in range(0, len(xs), 256):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xs[i:i + 256]), ys[i:i + 256])
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        print(f"epoch={epoch} train_mse={loss.item():.4f} val_mse={nn.functional.mse_loss(model(vx), vy).item():.4f}")
