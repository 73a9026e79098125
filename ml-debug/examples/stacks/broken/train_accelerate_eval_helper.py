"""Fine-tune a regression head with accelerate; evaluate every 100 steps from a helper."""
import torch
from accelerate import Accelerator
from torch import nn

accelerator = Accelerator(gradient_accumulation_steps=4)


def make_model():
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 1))


def evaluate(model, loader):
    model.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for xb, yb in loader:
            pred = model(xb)
            total += nn.functional.mse_loss(pred, yb, reduction="sum").item()
            n += len(yb)
    return total / n


def main(train_loader, val_loader, epochs=3):
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, opt, train_loader, val_loader = accelerator.prepare(model, opt, train_loader, val_loader)
    step = 0
    for epoch in range(epochs):
        for xb, yb in train_loader:
            with accelerator.accumulate(model):
                loss = nn.functional.mse_loss(model(xb), yb)
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad()
            step += 1
            if step % 100 == 0:
                accelerator.print(f"epoch {epoch} step {step} | loss {loss.item():.4f} | "
                                  f"val_mse {evaluate(model, val_loader):.4f}")
    return model
