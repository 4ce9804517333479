# expect: {"healthy": true}
# about: held out (round late 5): trains a small GAN on a ring of 8 Gaussians with BCE-with-logits losses; the discriminator and generator losses oscillate and the generator loss drifts upward for hundreds of steps, but every value stays finite.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Generator(nn.Module):
    def __init__(self, z_dim=4, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(z_dim, hidden), nn.LeakyReLU(0.2),
                                 nn.Linear(hidden, hidden), nn.LeakyReLU(0.2),
                                 nn.Linear(hidden, 2))

    def forward(self, z):
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, hidden), nn.LeakyReLU(0.2),
                                 nn.Linear(hidden, hidden), nn.LeakyReLU(0.2),
                                 nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


def ring_of_gaussians(n, gen, modes=8, radius=2.0, std=0.05):
    k = torch.randint(0, modes, (n,), generator=gen).float()
    ang = 2 * math.pi * k / modes
    centers = torch.stack([radius * torch.cos(ang), radius * torch.sin(ang)], 1)
    return centers + std * torch.randn(n, 2, generator=gen)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    G, D = Generator(), Discriminator()
    opt_g = torch.optim.Adam(G.parameters(), lr=args.lr, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=args.lr, betas=(0.5, 0.999))

    for step in range(args.steps):
        real = ring_of_gaussians(args.batch_size, gen)
        z = torch.randn(args.batch_size, 4, generator=gen)
        fake = G(z)

        d_real, d_fake = D(real), D(fake.detach())
        loss_d = F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real)) + \
            F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake))
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()

        d_gen = D(fake)
        loss_g = F.binary_cross_entropy_with_logits(d_gen, torch.ones_like(d_gen))   # non-saturating loss
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()

        if step % 50 == 0:
            print(f"step {step:4d} loss_d {loss_d.item():.3f} loss_g {loss_g.item():.3f} "
                  f"D(real) {torch.sigmoid(d_real).mean().item():.2f} D(fake) {torch.sigmoid(d_fake).mean().item():.2f}")


if __name__ == "__main__":
    main()
