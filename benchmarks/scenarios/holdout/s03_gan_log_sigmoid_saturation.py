# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.log.default", "module": null}
# about: held out: written after the suite by someone who had not read it. 1-D GAN (the "learn a Gaussian" tutorial). D ends in nn.Sigmoid; the losses are written
# 1-D GAN (the "learn a Gaussian" tutorial). D ends in nn.Sigmoid; the losses are written
# by hand with torch.log, as in the original GAN paper. Two optimizers.
import torch
import torch.nn as nn

torch.manual_seed(0)

G = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
D = nn.Sequential(nn.Linear(1, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2),
                  nn.Linear(64, 1), nn.Sigmoid())
opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)
opt_d = torch.optim.Adam(D.parameters(), lr=2e-2)   # "D learns faster"


def real_batch(n):
    return 8.0 + 0.5 * torch.randn(n, 1)


for it in range(300):
    # --- discriminator ---
    real = real_batch(64)
    fake = G(torch.randn(64, 4)).detach()
    d_loss = -torch.log(D(real)).mean() - torch.log(1 - D(fake)).mean()
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()
    # --- generator (non-saturating loss) ---
    fake = G(torch.randn(64, 4))
    g_loss = -torch.log(D(fake)).mean()
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
    if it % 20 == 0:
        print(f"it {it} d_loss {d_loss.item():.4f} g_loss {g_loss.item():.4f}")
