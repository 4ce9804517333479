# expect: {"cause": "learning-rate-too-high", "phase": "optimizer", "op": "aten.addcmul_.default", "module": "gru"}
# about: held out (cure round): 2-layer GRU forecaster with a mean/log-variance head trained on a hand-written Gaussian NLL with Adam at lr=5.0 instead of a sane 3e-3 (~1700x); after one oversized step the NLL is ~1e30 and its gradient ~1e33, so Adam's squared-gradient state overflows at step 1 and the NLL is inf at step 2, nan after.
"""Probabilistic one-step-ahead forecaster: GRU encoder with a mean / log-variance head (Gaussian NLL)."""
import argparse
import math
import os

import torch
import torch.nn as nn

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"


def make_series(n_series=512, length=48, seed=7):
    """Noisy sums of sinusoids with series-dependent noise level (heteroscedastic)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(length + 1).float()
    freq = 0.1 + 0.3 * torch.rand(n_series, 2, generator=g)
    phase = 2 * math.pi * torch.rand(n_series, 2, generator=g)
    amp = 0.5 + torch.rand(n_series, 2, generator=g)
    clean = (amp[:, :1] * torch.sin(freq[:, :1] * t + phase[:, :1])
             + amp[:, 1:] * torch.sin(freq[:, 1:] * t + phase[:, 1:]))
    noise_lvl = 0.05 + 0.3 * torch.rand(n_series, 1, generator=g)
    series = clean + noise_lvl * torch.randn(n_series, length + 1, generator=g)
    x = series[:, :-1].unsqueeze(-1)
    y = series[:, 1:].unsqueeze(-1)
    return x, y


class GRUForecaster(nn.Module):
    def __init__(self, hidden=48):
        super().__init__()
        self.gru = nn.GRU(1, hidden, num_layers=2, batch_first=True)
        self.mu = nn.Linear(hidden, 1)
        self.logvar = nn.Linear(hidden, 1)

    def forward(self, x):
        h, _ = self.gru(x)
        return self.mu(h), self.logvar(h)


def gaussian_nll(mu, logvar, y):
    return 0.5 * (logvar + (y - mu) ** 2 * torch.exp(-logvar) + math.log(2 * math.pi)).mean()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=3e-3 if FIXED else 5.0)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=48)
    ap.add_argument("--log-every", type=int, default=10)
    args = ap.parse_args()

    torch.manual_seed(0)
    x, y = make_series()
    xtr, ytr, xev, yev = x[:448], y[:448], x[448:], y[448:]
    model = GRUForecaster(args.hidden)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    with torch.no_grad():
        print(f"initial eval nll {gaussian_nll(*model(xev), yev).item():.4f}")
    for step in range(args.steps):
        idx = torch.randint(0, xtr.shape[0], (args.batch,))
        mu, logvar = model(xtr[idx])
        loss = gaussian_nll(mu, logvar, ytr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.log_every == 0:
            print(f"step {step} nll {loss.item():.4f} mean sigma {torch.exp(0.5 * logvar).mean().item():.4f}")

    with torch.no_grad():
        final = gaussian_nll(*model(xev), yev).item()
    print(f"final loss {final}")


if __name__ == "__main__":
    main()
