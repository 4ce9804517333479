# expect: {"cause": "learning-rate-too-high", "phase": "optimizer", "op": "aten._foreach_norm.Scalar", "module": ""}
# about: held out (cure round): residual dilated Conv1d (TCN-style) denoiser trained with SGD momentum 0.9 and clip_grad_norm_(max_norm=1000) at lr=0.8 instead of a sane 0.01 (80x); the clip threshold is far too loose to bite, activations and gradients reach ~1e23 by step 2, where the per-parameter norms inside clip_grad_norm_ overflow to inf, and the loss is inf from step 5 and nan after.
"""Dilated 1-D conv net (TCN-style) denoising regression, SGD+momentum with gradient clipping."""
import argparse
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"


def make_signals(n=1024, length=128, seed=5):
    """Piecewise-smooth signals + noise; target is the clean signal."""
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 1, length)
    f = 1 + 6 * torch.rand(n, 3, generator=g)
    ph = 2 * math.pi * torch.rand(n, 3, generator=g)
    a = torch.rand(n, 3, generator=g)
    clean = (a[:, :, None] * torch.sin(2 * math.pi * f[:, :, None] * t + ph[:, :, None])).sum(1)
    steps = (t[None, :] > torch.rand(n, 1, generator=g)).float() * torch.randn(n, 1, generator=g)
    clean = clean + steps
    noisy = clean + 0.4 * torch.randn(n, length, generator=g)
    return noisy.unsqueeze(1), clean.unsqueeze(1)


class ResidualTCN(nn.Module):
    def __init__(self, ch=32, n_blocks=4, k=3):
        super().__init__()
        self.inp = nn.Conv1d(1, ch, 1)
        self.blocks = nn.ModuleList()
        for i in range(n_blocks):
            d = 2 ** i
            self.blocks.append(nn.Sequential(
                nn.Conv1d(ch, ch, k, padding=d, dilation=d), nn.ReLU(),
                nn.Conv1d(ch, ch, 1),
            ))
        self.out = nn.Conv1d(ch, 1, 1)

    def forward(self, x):
        h = self.inp(x)
        for blk in self.blocks:
            h = h + blk(h)
        return x + self.out(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=0.01 if FIXED else 0.8)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--max-norm", type=float, default=1000.0)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--log-every", type=int, default=20)
    args = ap.parse_args()

    torch.manual_seed(0)
    x, y = make_signals()
    xtr, ytr, xev, yev = x[:896], y[:896], x[896:], y[896:]
    model = ResidualTCN()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    with torch.no_grad():
        print(f"initial eval loss {F.mse_loss(model(xev), yev).item():.4f}")
    for step in range(args.steps):
        idx = torch.randint(0, xtr.shape[0], (args.batch,))
        loss = F.mse_loss(model(xtr[idx]), ytr[idx])
        opt.zero_grad()
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=args.max_norm)
        opt.step()
        if step % args.log_every == 0:
            print(f"step {step} loss {loss.item():.4f} grad_norm {gnorm.item():.2f}")

    with torch.no_grad():
        final = F.mse_loss(model(xev), yev).item()
    print(f"final loss {final}")


if __name__ == "__main__":
    main()
