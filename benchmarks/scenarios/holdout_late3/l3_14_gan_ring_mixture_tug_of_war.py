# expect: {"healthy": true}
# about: held out (round late 3): a small GAN on an 8-mode ring mixture with BCE-with-logits losses; the generator loss drifts upward and both losses see-saw in the usual tug-of-war, but nothing becomes non-finite.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Generator(nn.Module):
    def __init__(self, d_noise=8, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_noise, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 2))

    def forward(self, z):
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


def sample_ring(n, g, modes=8, radius=2.0):
    k = torch.randint(0, modes, (n,), generator=g)
    angle = 2 * math.pi * k.float() / modes
    centres = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1)
    return centres + 0.05 * torch.randn(n, 2, generator=g)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    gen, disc = Generator(), Discriminator()
    opt_g = torch.optim.Adam(gen.parameters(), lr=args.lr, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(disc.parameters(), lr=args.lr, betas=(0.5, 0.999))
    ones = torch.ones(args.batch)
    zeros = torch.zeros(args.batch)

    for step in range(args.steps):
        real = sample_ring(args.batch, g)
        fake = gen(torch.randn(args.batch, 8, generator=g))

        d_loss = F.binary_cross_entropy_with_logits(disc(real), ones) + F.binary_cross_entropy_with_logits(disc(fake.detach()), zeros)
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()

        g_loss = F.binary_cross_entropy_with_logits(disc(fake), ones)
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()

        if step % 50 == 0:
            print(f"step {step:4d} d_loss {d_loss.item():.4f} g_loss {g_loss.item():.4f}")
    print(f"final loss d {d_loss.item():.4f} g {g_loss.item():.4f}")


if __name__ == "__main__":
    main()
