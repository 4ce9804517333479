# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": null}
# about: held out (lr round): 2-layer nn.GRU next-step sine forecaster with SGD nesterov momentum 0.9 + StepLR at lr=2.0 instead of a sane 0.02 (100x), predictions diverge and F.mse_loss overflows to inf at step 11.
"""Next-step forecasting of noisy multi-frequency sine waves with a GRU, SGD + nesterov momentum."""
import argparse
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"


def sine_batch(n, t):
    freq = 0.1 + 0.3 * torch.rand(n, 1)
    phase = 2 * math.pi * torch.rand(n, 1)
    amp = 1.0 + torch.rand(n, 1)
    tt = torch.arange(t + 1).float().view(1, -1)
    s = amp * torch.sin(freq * tt + phase) + 0.05 * torch.randn(n, t + 1)
    return s[:, :-1, None], s[:, 1:, None]


class Forecaster(nn.Module):
    def __init__(self, hidden=48):
        super().__init__()
        self.gru = nn.GRU(1, hidden, num_layers=2, batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        y, _ = self.gru(x)
        return self.out(y)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=0.02 if FIXED else 2.0)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seq", type=int, default=30)
    args = p.parse_args()

    torch.manual_seed(0)
    net = Forecaster()
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=args.momentum, nesterov=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=80, gamma=0.5)
    for step in range(args.steps):
        x, y = sine_batch(32, args.seq)
        loss = F.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.3g}")
    torch.manual_seed(99)
    x, y = sine_batch(256, args.seq)
    with torch.no_grad():
        print(f"final loss {F.mse_loss(net(x), y).item()}")


if __name__ == "__main__":
    main()
