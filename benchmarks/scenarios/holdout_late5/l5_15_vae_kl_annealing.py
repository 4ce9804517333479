# expect: {"healthy": true}
# about: held out (round late 5): trains a VAE on binary rectangle images with a quadratic KL warm-up over 600 steps; the total loss rises for ~400 steps as beta grows and logvar goes through exp, but logvar is clamped and everything stays finite.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class VAE(nn.Module):
    def __init__(self, d_x=64, d_h=128, d_z=8):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d_x, d_h), nn.ReLU(), nn.Linear(d_h, d_h), nn.ReLU())
        self.mu = nn.Linear(d_h, d_z)
        self.logvar = nn.Linear(d_h, d_z)
        self.dec = nn.Sequential(nn.Linear(d_z, d_h), nn.ReLU(), nn.Linear(d_h, d_h), nn.ReLU(), nn.Linear(d_h, d_x))

    def forward(self, x, eps):
        h = self.enc(x)
        mu = self.mu(h)
        logvar = self.logvar(h).clamp(-8.0, 8.0)
        z = mu + torch.exp(0.5 * logvar) * eps
        return self.dec(z), mu, logvar


def binary_shapes(n, gen, side=8):
    """8x8 binary images of random axis-aligned rectangles."""
    imgs = torch.zeros(n, side, side)
    r0 = torch.randint(0, side - 2, (n,), generator=gen)
    c0 = torch.randint(0, side - 2, (n,), generator=gen)
    hh = torch.randint(2, side, (n,), generator=gen)
    ww = torch.randint(2, side, (n,), generator=gen)
    rows = torch.arange(side)
    inside_r = (rows[None] >= r0[:, None]) & (rows[None] < (r0 + hh)[:, None])
    inside_c = (rows[None] >= c0[:, None]) & (rows[None] < (c0 + ww)[:, None])
    imgs = (inside_r[:, :, None] & inside_c[:, None, :]).float()
    flip = torch.rand(n, side * side, generator=gen) < 0.02
    return torch.where(flip, 1 - imgs.flatten(1), imgs.flatten(1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=900)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--anneal-steps", type=int, default=600)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    data = binary_shapes(6000, gen)
    model = VAE()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    for step in range(args.steps):
        idx = torch.randint(0, data.shape[0], (args.batch_size,), generator=gen)
        x = data[idx]
        eps = torch.randn(args.batch_size, 8, generator=gen)
        logits, mu, logvar = model(x, eps)
        rec = F.binary_cross_entropy_with_logits(logits, x, reduction="sum") / args.batch_size
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / args.batch_size
        beta = min(1.0, step / args.anneal_steps) ** 2          # KL warm-up
        loss = rec + beta * kl
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step:4d} beta {beta:.3f} loss {loss.item():.2f} rec {rec.item():.2f} kl {kl.item():.2f}")


if __name__ == "__main__":
    main()
