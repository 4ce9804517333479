# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": ""}
# about: held out (round late 2): LSTM multi-step forecaster trained with SGD and a OneCycleLR schedule whose max_lr (15) is far too high; training is fine early on, then diverges as the LR climbs to the peak and the MSE loss first overflows to inf at step 88.
import argparse
import math

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--max-lr", type=float, default=15.0)
args = parser.parse_args()

torch.manual_seed(3)

# synthetic multivariate sensor series: 3 channels, daily + weekly seasonality + noise
T = 6000
t = torch.arange(T, dtype=torch.float32)
series = torch.stack([
    torch.sin(2 * math.pi * t / 24) + 0.3 * torch.sin(2 * math.pi * t / 168),
    torch.cos(2 * math.pi * t / 24 + 0.5),
    0.5 * torch.sin(2 * math.pi * t / 12),
], dim=1) + 0.1 * torch.randn(T, 3)

WINDOW, HORIZON = 48, 6


def sample_batch(bs=64):
    start = torch.randint(0, T - WINDOW - HORIZON, (bs,))
    idx = start[:, None] + torch.arange(WINDOW + HORIZON)
    chunk = series[idx]  # (bs, W+H, 3)
    return chunk[:, :WINDOW], chunk[:, WINDOW:, 0]


class Forecaster(nn.Module):
    def __init__(self, n_in=3, hidden=32, horizon=HORIZON):
        super().__init__()
        self.lstm = nn.LSTM(n_in, hidden, batch_first=True)
        self.head = nn.Linear(hidden, horizon)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


model = Forecaster()
opt = torch.optim.SGD(model.parameters(), lr=args.max_lr / 25, momentum=0.9)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.max_lr, total_steps=args.steps, pct_start=0.3)
loss_fn = nn.MSELoss()

for step in range(args.steps):
    x, y = sample_batch()
    loss = loss_fn(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    if step % 10 == 0:
        print(f"step {step:4d}  lr {sched.get_last_lr()[0]:.3f}  loss {loss.item():.4f}")

print(f"final loss {loss.item():.4f}")
