# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.addmm.default", "module": "2"}
# about: held out (lr round): plain-SGD 3-layer ReLU MLP regression (F.mse_loss) with lr=5.0 instead of a sane 0.05 (100x), weights blow up and the hidden Linear overflows to inf at step 4.
"""Fit a small ReLU MLP to a noisy nonlinear regression target with plain SGD."""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"


def make_data(n=1024, d=8):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, 1, generator=g)
    y = torch.sin(x @ w) + 0.5 * x[:, :1] ** 2 + 0.1 * torch.randn(n, 1, generator=g)
    return x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=0.05 if FIXED else 5.0)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()

    torch.manual_seed(0)
    x, y = make_data()
    model = nn.Sequential(
        nn.Linear(8, 64), nn.ReLU(),
        nn.Linear(64, 64), nn.ReLU(),
        nn.Linear(64, 1),
    )
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (args.batch,))
        pred = model(x[idx])
        loss = F.mse_loss(pred, y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    with torch.no_grad():
        final = F.mse_loss(model(x), y).item()
    print(f"final loss {final}")


if __name__ == "__main__":
    main()
