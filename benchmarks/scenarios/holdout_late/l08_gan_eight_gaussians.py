# expect: {"healthy": true}
# about: held out (round late): a small GAN on a ring of 8 Gaussians with BCE-with-logits losses and two Adam optimizers; discriminator and generator losses oscillate throughout, all finite.
import math
import torch
import torch.nn as nn

torch.manual_seed(26)
torch.set_num_threads(1)


def sample_real(n):
    """8 Gaussians arranged on a ring of radius 2."""
    k = torch.randint(0, 8, (n,))
    angle = k.float() * 2 * math.pi / 8
    centers = torch.stack([2 * torch.cos(angle), 2 * torch.sin(angle)], 1)
    return centers + 0.05 * torch.randn(n, 2)


class Generator(nn.Module):
    def __init__(self, z_dim=8, hidden=128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(z_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def forward(self, z):
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self, hidden=128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x).squeeze(1)


G, D = Generator(), Discriminator()
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999))
bce = nn.BCEWithLogitsLoss()
batch_size = 128

for step in range(300):
    # discriminator update
    real = sample_real(batch_size)
    fake = G(torch.randn(batch_size, 8)).detach()
    d_loss = bce(D(real), torch.ones(batch_size)) + bce(D(fake), torch.zeros(batch_size))
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()

    # generator update (non-saturating loss)
    fake = G(torch.randn(batch_size, 8))
    g_loss = bce(D(fake), torch.ones(batch_size))
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()

    if step % 10 == 0:
        print(f"step {step:4d}  d_loss {d_loss.item():.4f}  g_loss {g_loss.item():.4f}  "
              f"fake radius {fake.detach().norm(dim=1).mean().item():.2f}")
