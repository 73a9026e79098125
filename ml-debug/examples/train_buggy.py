"""Small classifier training script with several silent bugs planted for the scanner demo.

It does not run here (no torch needed to scan it); it is what a real script looks like when the
loss goes down slowly and the validation number is a little too good.
"""
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.preprocessing import StandardScaler
from torch import nn


class Rows(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        noise = np.random.normal(0, 0.1, size=self.x.shape[1])
        return self.x[i] + noise, self.y[i]


class Net(nn.Module):
    def __init__(self, d_in, n_classes):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, 64), nn.ReLU(), nn.Dropout(0.2))
        self.head = nn.Linear(64, n_classes)

    def forward(self, x):
        h = self.body(x)
        return F.softmax(self.head(h), dim=-1)


def train(x_all, y_all, x_val, y_val, epochs=10):
    scaler = StandardScaler()
    x_all = scaler.fit_transform(x_all)
    x_val = scaler.transform(x_val)
    model = Net(x_all.shape[1], int(y_all.max()) + 1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.5)
    loader = torch.utils.data.DataLoader(Rows(x_all, y_all), batch_size=32, num_workers=4)
    for epoch in range(epochs):
        for xb, yb in loader:
            probs = model(xb.float())
            loss = F.cross_entropy(probs, yb)
            if torch.isnan(loss):
                continue
            loss.backward()
            opt.step()
            sched.step()
        model.eval()
        with torch.no_grad():
            val_probs = model(torch.as_tensor(x_val).float())
            acc = (val_probs.argmax(-1) == torch.as_tensor(y_val)).float().mean().item()
        target = val_probs.detach()
        print(f"epoch={epoch} loss={loss.item():.4f} val_acc={acc:.4f} drift={target.squeeze().mean():.3f}")
    return model
