# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.log.default", "module": null}
# about: held out: written after the suite by someone who had not read it. VAE on synthetic 2-blob data. Encoder predicts sigma through a ReLU ("sigma must be
# VAE on synthetic 2-blob data. Encoder predicts sigma through a ReLU ("sigma must be
# positive"), and the KL term is written with torch.log(sigma**2).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
N, D, Z = 2048, 20, 8
centers = torch.randn(2, D) * 2
X = centers[torch.randint(0, 2, (N,))] + 0.3 * torch.randn(N, D)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(D, 64), nn.ReLU())
        self.mu = nn.Linear(64, Z)
        self.sigma = nn.Sequential(nn.Linear(64, Z), nn.ReLU())

    def forward(self, x):
        h = self.body(x)
        return self.mu(h), self.sigma(h)


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = Encoder()
        self.dec = nn.Sequential(nn.Linear(Z, 64), nn.ReLU(), nn.Linear(64, D))

    def forward(self, x):
        mu, sigma = self.enc(x)
        z = mu + sigma * torch.randn_like(sigma)
        return self.dec(z), mu, sigma


def vae_loss(recon, x, mu, sigma):
    rec = F.mse_loss(recon, x, reduction="sum") / x.size(0)
    kl = -0.5 * torch.sum(1 + torch.log(sigma ** 2) - mu ** 2 - sigma ** 2) / x.size(0)
    return rec + kl


model = VAE()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(2):
    perm = torch.randperm(N)
    for i in range(0, N, 128):
        x = X[perm[i:i + 128]]
        recon, mu, sigma = model(x)
        loss = vae_loss(recon, x, mu, sigma)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
