"""Probabilistic retail-demand forecaster: an MLP over lagged sales and calendar features
predicts a mean and a softplus variance, trained with a hand-written Gaussian NLL.
Latent hazard (line 50): heteroscedastic_nll() takes torch.log(var) (and divides by var) with no
eps/clamp; softplus only underflows to 0 for raw < ~-100, far below the raw values reached here."""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def make_series(n_stores=40, n_days=400, gen=None):
    t = torch.arange(n_days, dtype=torch.float32)
    level = 5.0 + 3.0 * torch.rand(n_stores, 1, generator=gen)
    weekly = torch.sin(2 * math.pi * t / 7.0) * (0.5 + torch.rand(n_stores, 1, generator=gen))
    trend = 0.002 * t * torch.randn(n_stores, 1, generator=gen)
    scale = 0.2 + 0.8 * (1 + torch.sin(2 * math.pi * t / 30.0)) / 2  # noise varies over a month
    noise = scale * torch.randn(n_stores, n_days, generator=gen)
    return level + weekly + trend + noise


def windows(series, lags=14):
    xs, ys, days = [], [], []
    n_days = series.shape[1]
    for d in range(lags, n_days):
        xs.append(series[:, d - lags:d])
        ys.append(series[:, d])
        days.append(torch.full((series.shape[0],), d, dtype=torch.float32))
    x = torch.cat(xs)
    day = torch.cat(days)
    cal = torch.stack([torch.sin(2 * math.pi * day / 7), torch.cos(2 * math.pi * day / 7),
                       torch.sin(2 * math.pi * day / 30), torch.cos(2 * math.pi * day / 30)], 1)
    return torch.cat([x, cal], 1), torch.cat(ys)


class Forecaster(nn.Module):
    def __init__(self, n_in, hidden=64):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.mu = nn.Linear(hidden, 1)
        self.raw_var = nn.Linear(hidden, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.mu(h).squeeze(-1), F.softplus(self.raw_var(h)).squeeze(-1)


def heteroscedastic_nll(mu, var, y):
    nll = 0.5 * torch.log(var) + 0.5 * (y - mu) ** 2 / var
    return nll.mean()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x, y = windows(make_series(gen=g))
    x_mean, x_std = x.mean(0), x.std(0) + 1e-6
    x = (x - x_mean) / x_std
    y_mean = y.mean()
    y = y - y_mean

    net = Forecaster(x.shape[1])
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (256,), generator=g)
        mu, var = net(x[idx])
        loss = heteroscedastic_nll(mu, var, y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step={step} nll={loss.item():.4f} mean_var={var.mean().item():.4f}")
    print(f"final nll={loss.item():.4f}")


if __name__ == "__main__":
    main()
