# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.log.default", "module": null}
# about: held out (round 2): written after the code by someone who had not read it or the suite. a vanilla GAN on "sensor" vectors (raw units, 0..255), two Adam optimizers (G, D).
# The generator has a linear output (no tanh: sensor values are unbounded) and uses the
# original minimax loss  minimize log(1 - D(G(z)))  written by hand. G out-runs D (G lr 50x),
# pushes its samples far along D's "real" direction, D's sigmoid rounds to exactly 1.0 and
# log(1 - 1.0) = log(0) = -inf. The log is in the training loop, outside any module -> module
# null. Expected at a generator step (after some dozens of iterations).
import torch
import torch.nn as nn

torch.manual_seed(1)
torch.set_num_threads(1)

DIM, ZDIM, N = 32, 8, 512
real_data = torch.rand(N, DIM) * 255.0          # forgot: / 127.5 - 1


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(ZDIM, 64), nn.LeakyReLU(0.2), nn.Linear(64, DIM))

    def forward(self, z):
        return self.net(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(DIM, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))

    def forward(self, x):
        return torch.sigmoid(self.body(x))


G, D = Generator(), Discriminator()
opt_g = torch.optim.Adam(G.parameters(), lr=1e-2, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))

for it in range(400):
    idx = torch.randint(0, N, (64,))
    x = real_data[idx]
    z = torch.randn(64, ZDIM)

    # --- discriminator step
    opt_d.zero_grad()
    fake = G(z).detach()
    d_loss = -(torch.log(D(x) + 1e-8).mean() + torch.log(1 - D(fake) + 1e-8).mean())
    d_loss.backward()
    opt_d.step()

    # --- generator step (minimax loss: minimize log(1 - D(G(z))))
    opt_g.zero_grad()
    g_loss = torch.log(1 - D(G(z))).mean()
    g_loss.backward()
    opt_g.step()

    if it % 25 == 0:
        print(f"iter {it:3d}  d_loss {d_loss.item():.4f}  g_loss {g_loss.item():.4f}")
print("done")
