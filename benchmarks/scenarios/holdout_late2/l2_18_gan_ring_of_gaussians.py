# expect: {"healthy": true}
# about: held out (round late 2): small MLP GAN fitting a ring of 8 Gaussians; the discriminator and generator losses oscillate and the generator loss repeatedly climbs (the usual adversarial tug-of-war), but nothing ever becomes non-finite.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--zdim", type=int, default=8)
args = parser.parse_args()

torch.manual_seed(18)


def sample_real(n):
    k = torch.randint(0, 8, (n,))
    angle = k.float() * 2 * math.pi / 8
    centers = torch.stack([torch.cos(angle), torch.sin(angle)], 1) * 2.0
    return centers + 0.05 * torch.randn(n, 2)


class Generator(nn.Module):
    def __init__(self, z):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(z, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, z):
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


G, D = Generator(args.zdim), Discriminator()
opt_g = torch.optim.Adam(G.parameters(), lr=args.lr, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=args.lr, betas=(0.5, 0.999))

bs = 128
for step in range(args.steps):
    # discriminator update
    real = sample_real(bs)
    fake = G(torch.randn(bs, args.zdim)).detach()
    d_real, d_fake = D(real), D(fake)
    loss_d = F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real)) + \
        F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake))
    opt_d.zero_grad()
    loss_d.backward()
    opt_d.step()

    # generator update (non-saturating loss)
    d_gen = D(G(torch.randn(bs, args.zdim)))
    loss_g = F.binary_cross_entropy_with_logits(d_gen, torch.ones_like(d_gen))
    opt_g.zero_grad()
    loss_g.backward()
    opt_g.step()

    if step % 25 == 0:
        print(f"step {step:4d}  loss_d {loss_d.item():.4f}  loss_g {loss_g.item():.4f}")

print(f"final loss {loss_g.item():.4f}")
