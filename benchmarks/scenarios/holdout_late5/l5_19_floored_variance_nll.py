# expect: {"healthy": true}
# about: held out (round late 5): trains a heteroscedastic regressor on nearly noiseless data with a Gaussian NLL where var = softplus(.) + 1e-6; the variance collapses toward the floor, the NLL goes negative with occasional spikes, and a tail-NLL divides by a count clamped to >= 1, so log/div/sqrt stay finite.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class HeteroscedasticNet(nn.Module):
    """Predicts a mean and a variance; the variance is floored at var_floor."""

    def __init__(self, d_in, hidden=64, var_floor=1e-6):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU())
        self.mean = nn.Linear(hidden, 1)
        self.raw_var = nn.Linear(hidden, 1)
        self.var_floor = var_floor

    def forward(self, x):
        h = self.body(x)
        var = F.softplus(self.raw_var(h)).squeeze(-1) + self.var_floor
        return self.mean(h).squeeze(-1), var


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hard-frac-thresh", type=float, default=3.0)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    d_in = 6
    w = torch.randn(d_in, generator=gen)

    model = HeteroscedasticNet(d_in)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    for step in range(args.steps):
        x = torch.randn(args.batch_size, d_in, generator=gen)
        # a deterministic simulator: almost no observation noise, so the variance collapses
        y = torch.sin(x @ w) + 1e-4 * torch.randn(args.batch_size, generator=gen)
        mu, var = model(x)
        nll_i = 0.5 * (torch.log(var) + (y - mu) ** 2 / var)
        # report the mean NLL of 'surprising' points, guarding against an empty set
        z = (y - mu).abs() / torch.sqrt(var)
        surprising = (z > args.hard_frac_thresh).float()
        tail_nll = (nll_i * surprising).sum() / surprising.sum().clamp(min=1.0)
        loss = nll_i.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step:4d} nll {loss.item():9.3f} min var {var.min().item():.2e} "
                  f"n surprising {int(surprising.sum().item()):3d} tail nll {tail_nll.item():9.3f}")


if __name__ == "__main__":
    main()
