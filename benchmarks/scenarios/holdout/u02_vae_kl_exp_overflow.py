# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.exp.default", "module": ""}
# about: held out (round 2): written after the code by someone who had not read it or the suite. a small VAE on tabular sensor rows. The encoder's log-variance head is unbounded and
# the reparameterisation  std = exp(0.5 * logvar)  lives in VAE.forward (module "" = the model
# itself). Training is fine until step 40, when a batch with a sensor glitch (the int16 full-scale
# 32767 left in one cell) arrives: logvar jumps past 177, exp(0.5*logvar) overflows to
# +inf. The KL term's logvar.exp() overflows too, but later in the step (in the loss).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)

N, D, Z = 2048, 24, 4
data = torch.randn(N, D) @ torch.randn(D, D) * 0.3
data[40 * 32 + 5, 0] = 32767.0       # the spike: int16 full scale (saturated ADC), row 5 of batch 40


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, 64))
        self.mu = nn.Linear(64, Z)
        self.logvar = nn.Linear(64, Z)
        self.dec = nn.Sequential(nn.Linear(Z, 64), nn.ReLU(), nn.Linear(64, D))

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        std = torch.exp(0.5 * logvar)
        z = mu + std * torch.randn_like(std)
        return self.dec(z), mu, logvar


def vae_loss(recon, x, mu, logvar):
    rec = F.mse_loss(recon, x, reduction="sum") / x.shape[0]
    kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / x.shape[0]
    return rec + kl


model = VAE()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(N // 32):
    x = data[step * 32:(step + 1) * 32]
    recon, mu, logvar = model(x)
    loss = vae_loss(recon, x, mu, logvar)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step:3d} loss {loss.item():.4f}")
print("finished")
