# expect: {"healthy": true}
# about: held out (round late 4): a small GAN on an 8-Gaussian ring with BCE-with-logits losses; discriminator and generator losses bounce and trade off for the whole run and the fake samples wander, but everything stays finite.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def sample_ring(n, gen, modes=8, radius=2.0, std=0.05):
    k = torch.randint(0, modes, (n,), generator=gen).float()
    ang = 2 * math.pi * k / modes
    centers = torch.stack([radius * torch.cos(ang), radius * torch.sin(ang)], 1)
    return centers + std * torch.randn(n, 2, generator=gen)


class Generator(nn.Module):
    def __init__(self, z_dim=8, hidden=128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(z_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 2))

    def forward(self, z):
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self, hidden=128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden),
                                 nn.LeakyReLU(0.2), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=800)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    data_gen = torch.Generator().manual_seed(0)
    noise_gen = torch.Generator().manual_seed(1)
    G, D = Generator(), Discriminator()
    opt_g = torch.optim.Adam(G.parameters(), lr=args.lr, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=args.lr, betas=(0.5, 0.999))
    ones = torch.ones(args.batch_size)
    zeros = torch.zeros(args.batch_size)
    for it in range(args.iters):
        real = sample_ring(args.batch_size, data_gen)
        z = torch.randn(args.batch_size, 8, generator=noise_gen)
        fake = G(z)

        d_loss = F.binary_cross_entropy_with_logits(D(real), ones) + \
            F.binary_cross_entropy_with_logits(D(fake.detach()), zeros)
        opt_d.zero_grad()
        d_loss.backward()
        opt_d.step()

        g_loss = F.binary_cross_entropy_with_logits(D(fake), ones)  # non-saturating generator loss
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()

        if it % 50 == 0:
            r = fake.detach().norm(dim=1)
            print(f"iter {it:4d} d_loss {d_loss.item():.3f} g_loss {g_loss.item():.3f} "
                  f"fake radius {r.mean().item():.2f}+-{r.std().item():.2f}")


if __name__ == "__main__":
    main()
