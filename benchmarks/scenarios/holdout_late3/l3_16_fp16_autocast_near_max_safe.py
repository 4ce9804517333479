# expect: {"healthy": true}
# about: held out (round late 3): an MLP regressing yearly rent in raw dollars (up to 42k) under torch.autocast float16; the float16 predictions overshoot to ~56k, close to the 65504 float16 max, but never overflow.
import argparse

import torch
import torch.nn as nn


class RentNet(nn.Module):
    """Predicts yearly rent in dollars from apartment features."""

    def __init__(self, d_in=10, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.head(self.body(x)).squeeze(-1)


def make_data(n=4096, d=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.rand(d, generator=g)
    # yearly rent: roughly 15k .. 42k dollars
    y = 28000 + 4000 * (x @ w) / w.norm() + 500 * torch.randn(n, generator=g)
    return x, y.clamp(15000, 42000)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, y = make_data()
    model = RentNet()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    crit = nn.L1Loss()

    n = x.shape[0]
    for step in range(args.steps):
        idx = torch.arange(step * args.batch, (step + 1) * args.batch) % n
        with torch.autocast("cpu", dtype=torch.float16):
            pred = model(x[idx])
            loss = crit(pred.float(), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            print(f"step {step:4d} loss {loss.item():.1f} max pred {pred.max().item():.0f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
