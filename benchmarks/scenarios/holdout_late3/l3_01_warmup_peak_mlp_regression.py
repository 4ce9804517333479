# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": ""}
# about: held out (round late 3): an MLP regressor trained with SGD+momentum under a linear warm-up whose peak lr (1.2) is too high; it fits fine early on, diverges once the lr passes ~0.8, and the MSE loss first overflows to inf in the forward pass at step 68.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Regressor(nn.Module):
    def __init__(self, d_in=16, hidden=64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, 1),
        )

    def forward(self, x):
        return self.net(x).squeeze(-1)


def make_data(n=2048, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=g)
    y = torch.sin(x @ w / 2) + 0.1 * (x[:, 0] * x[:, 1]) + 0.05 * torch.randn(n, generator=g)
    return x, y


def lr_at(step, peak, warmup):
    # linear warm-up, then constant at the peak
    return peak * min(1.0, (step + 1) / warmup)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=1.2)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, y = make_data()
    model = Regressor()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    n = x.shape[0]
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.lr, args.warmup)
        idx = torch.arange(step * args.batch, (step + 1) * args.batch) % n
        pred = model(x[idx])
        loss = F.mse_loss(pred, y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            print(f"step {step:4d} lr {opt.param_groups[0]['lr']:.4f} loss {loss.item():.4f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
