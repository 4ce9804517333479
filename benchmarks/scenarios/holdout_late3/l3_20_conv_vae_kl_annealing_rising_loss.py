# expect: {"healthy": true}
# about: held out (round late 3): a convolutional VAE with a delayed KL warm-up and Adam(eps=1e-10); the KL term balloons to ~290 while beta is 0 and the total loss goes back up once beta ramps in, but every value stays finite.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvVAE(nn.Module):
    def __init__(self, d_z=8):
        super().__init__()
        self.enc = nn.Sequential(
            nn.Conv2d(1, 16, 4, stride=2, padding=1),  # 8x8
            nn.ReLU(),
            nn.Conv2d(16, 32, 4, stride=2, padding=1),  # 4x4
            nn.ReLU(),
            nn.Flatten(),
        )
        self.mu = nn.Linear(32 * 4 * 4, d_z)
        self.logvar = nn.Linear(32 * 4 * 4, d_z)
        self.dec_in = nn.Linear(d_z, 32 * 4 * 4)
        self.dec = nn.Sequential(
            nn.ReLU(),
            nn.Unflatten(1, (32, 4, 4)),
            nn.ConvTranspose2d(32, 16, 4, stride=2, padding=1),  # 8x8
            nn.ReLU(),
            nn.ConvTranspose2d(16, 1, 4, stride=2, padding=1),  # 16x16 logits
        )

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.dec(self.dec_in(z)), mu, logvar


def make_shapes(n=1024, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = torch.arange(16).float()
    yy, xx = r.view(1, 16, 1), r.view(1, 1, 16)
    cy = torch.randint(4, 12, (n, 1, 1), generator=g).float()
    cx = torch.randint(4, 12, (n, 1, 1), generator=g).float()
    size = torch.randint(2, 5, (n, 1, 1), generator=g).float()
    square = torch.rand(n, 1, 1, generator=g) < 0.5
    disc = ((yy - cy) ** 2 + (xx - cx) ** 2) <= size ** 2
    box = ((yy - cy).abs() <= size) & ((xx - cx).abs() <= size)
    img = torch.where(square, box, disc).float()
    return img.unsqueeze(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--anneal-start", type=int, default=100)
    p.add_argument("--anneal-steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = make_shapes()
    model = ConvVAE()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, eps=1e-10)

    n = data.shape[0]
    for step in range(args.steps):
        # KL warm-up: pure autoencoder first, then the KL weight ramps to 1 (the loss goes UP meanwhile)
        beta = min(1.0, max(0.0, (step - args.anneal_start) / args.anneal_steps))
        idx = torch.arange(step * args.batch, (step + 1) * args.batch) % n
        x = data[idx]
        logits, mu, logvar = model(x)
        rec = F.binary_cross_entropy_with_logits(logits, x, reduction="sum") / x.shape[0]
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / x.shape[0]
        loss = rec + beta * kl
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step:4d} beta {beta:.2f} rec {rec.item():.2f} kl {kl.item():.2f} loss {loss.item():.2f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
