# expect: {"cause": "low-precision-overflow", "phase": "forward", "op": "aten.addmm.default", "module": "head"}
# about: held out (round late 3): an MLP regressing yearly salaries in raw dollars (up to ~120k) under torch.autocast float16 with Adam; the predictions grow toward the targets until the float16 output Linear exceeds 65504 and gives inf in the forward pass at step 40.
import argparse

import torch
import torch.nn as nn


class SalaryNet(nn.Module):
    def __init__(self, d_in=12, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.head(self.body(x)).squeeze(-1)


def make_data(n=4096, d=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    w = torch.rand(d, generator=g)
    # yearly salary in dollars: roughly 20k .. 120k
    y = 60000 + 15000 * (x @ w) / w.norm() + 2000 * torch.randn(n, generator=g)
    return x, y.clamp(min=15000)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, y = make_data()
    model = SalaryNet()
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
            print(f"step {step:4d} loss {loss.item():.1f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
