# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": ["", null]}
# about: held out (lr round): nn.LSTM running-mean sequence regression (nn.MSELoss) with plain SGD at lr=10 instead of a sane 0.1 (100x), the readout diverges and the MSE overflows to inf at step 12.
"""LSTM regression: read a sequence of noisy numbers and predict their running mean."""
import os

import torch
import torch.nn as nn

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"

CONFIG = {
    "seq_len": 20,
    "hidden": 32,
    "batch": 32,
    "steps": 250,
    "lr": 0.1 if FIXED else 10.0,
}


class SeqRegressor(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.lstm = nn.LSTM(input_size=1, hidden_size=hidden, batch_first=True)
        self.readout = nn.Linear(hidden, 1)

    def forward(self, x):
        h, _ = self.lstm(x)
        return self.readout(h)


def batch(n, t):
    x = torch.randn(n, t, 1) + 0.5 * torch.randn(n, 1, 1)
    y = x.cumsum(1) / torch.arange(1, t + 1).view(1, t, 1)
    return x, y


def train(cfg):
    torch.manual_seed(0)
    model = SeqRegressor(cfg["hidden"])
    loss_fn = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    for step in range(cfg["steps"]):
        x, y = batch(cfg["batch"], cfg["seq_len"])
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    x, y = batch(256, cfg["seq_len"])
    with torch.no_grad():
        return loss_fn(model(x), y).item()


if __name__ == "__main__":
    print(f"final loss {train(CONFIG)}")
