# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.sqrt.default", "module": "decoder"}
# about: held out (round late 3): a VAE with a learned, unconstrained per-pixel observation variance (started at 1, std = var.sqrt()); Adam drives the variance down as the reconstruction improves until an update overshoots below zero, and the sqrt in the decoder gives NaN in the forward pass at step 80.
import argparse
import math

import torch
import torch.nn as nn


class Encoder(nn.Module):
    def __init__(self, d_x, d_z, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_x, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.mu = nn.Linear(hidden, d_z)
        self.logvar = nn.Linear(hidden, d_z)

    def forward(self, x):
        h = self.body(x)
        return self.mu(h), self.logvar(h)


class Decoder(nn.Module):
    def __init__(self, d_z, d_x, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_z, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.mean = nn.Linear(hidden, d_x)
        # learned per-pixel observation variance, started at 1
        self.obs_var = nn.Parameter(torch.ones(d_x))

    def forward(self, z):
        h = self.body(z)
        std = self.obs_var.sqrt()
        return self.mean(h), std


class VAE(nn.Module):
    def __init__(self, d_x=20, d_z=2):
        super().__init__()
        self.encoder = Encoder(d_x, d_z)
        self.decoder = Decoder(d_z, d_x)

    def forward(self, x):
        mu, logvar = self.encoder(x)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        mean, std = self.decoder(z)
        return mean, std, mu, logvar


def make_data(n=2048, d_x=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(n, 2, generator=g) * 2 - 1
    proj = torch.randn(6, d_x, generator=g) / 2
    feats = torch.cat([t, torch.sin(3 * t), t[:, :1] * t[:, 1:], t ** 2], dim=1)[:, :6]
    return feats @ proj + 0.05 * torch.randn(n, d_x, generator=g)


def elbo_loss(x, mean, std, mu, logvar):
    rec = 0.5 * ((x - mean) / std) ** 2 + torch.log(std) + 0.5 * math.log(2 * math.pi)
    kl = -0.5 * (1 + logvar - mu ** 2 - logvar.exp())
    return rec.sum(1).mean() + kl.sum(1).mean()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = make_data()
    model = VAE()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    n = data.shape[0]
    for step in range(args.steps):
        idx = torch.arange(step * args.batch, (step + 1) * args.batch) % n
        x = data[idx]
        mean, std, mu, logvar = model(x)
        loss = elbo_loss(x, mean, std, mu, logvar)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step:4d} loss {loss.item():.4f} mean std {std.mean().item():.4f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
