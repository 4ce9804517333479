# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": ""}
# about: held out (cure round): 3-layer SiLU MLP regression trained with SGD (momentum 0.9, weight decay 5e-4) at lr=1.5 instead of a sane 0.01 (150x); momentum amplifies the overshoot, the outputs blow up and the MSE overflows to inf around step 9.
"""Regress a smooth multi-output target from tabular features with a SiLU MLP."""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"


def make_data(n_train=2048, n_eval=512, d=12, k=3):
    g = torch.Generator().manual_seed(11)
    n = n_train + n_eval
    x = torch.randn(n, d, generator=g)
    proj = torch.randn(d, k, generator=g) / d ** 0.5
    y = torch.tanh(x @ proj) * 2.0 + 0.3 * (x[:, :k] * x[:, k:2 * k]) + 0.05 * torch.randn(n, k, generator=g)
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


class Regressor(nn.Module):
    def __init__(self, d_in, d_out, width=96):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, width), nn.SiLU(),
            nn.Linear(width, width), nn.SiLU(),
            nn.Linear(width, d_out),
        )

    def forward(self, x):
        return self.net(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=0.01 if FIXED else 1.5)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args()

    torch.manual_seed(0)
    (xtr, ytr), (xev, yev) = make_data()
    model = Regressor(xtr.shape[1], ytr.shape[1])
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                          weight_decay=args.weight_decay)

    with torch.no_grad():
        print(f"initial eval loss {F.mse_loss(model(xev), yev).item():.4f}")
    for step in range(args.steps):
        idx = torch.randint(0, xtr.shape[0], (args.batch,))
        loss = F.mse_loss(model(xtr[idx]), ytr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 40 == 0 or step < 5:
            print(f"step {step} loss {loss.item():.5f}")

    model.eval()
    with torch.no_grad():
        final = F.mse_loss(model(xev), yev).item()
    print(f"final loss {final}")


if __name__ == "__main__":
    main()
