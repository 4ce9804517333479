# expect: {"healthy": true}
# about: held out (round late 2): VAE on synthetic 12x12 binary glyphs with a hand-written Bernoulli log-likelihood; some decoder probabilities round to exactly 1.0 as the fit sharpens, but they are clamped to [1e-6, 1-1e-6] before the log, so log-probs bottom out near -13.8 and everything stays finite.
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--latent", type=int, default=4)
args = parser.parse_args()

torch.manual_seed(15)

S = 12


def make_glyphs(n):
    """Binary images of random axis-aligned rectangles and crosses."""
    imgs = torch.zeros(n, S, S)
    kind = torch.randint(0, 2, (n,))
    a = torch.randint(1, 6, (n,))
    b = torch.randint(6, 11, (n,))
    for i in range(n):
        lo, hi = int(a[i]), int(b[i])
        if kind[i] == 0:
            imgs[i, lo:hi, lo:hi] = 1.0
        else:
            imgs[i, lo:hi, (lo + hi) // 2] = 1.0
            imgs[i, (lo + hi) // 2, lo:hi] = 1.0
    return imgs.view(n, -1)


class VAE(nn.Module):
    def __init__(self, d=S * S, h=128, z=4):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, h), nn.ReLU())
        self.mu = nn.Linear(h, z)
        self.logvar = nn.Linear(h, z)
        self.dec = nn.Sequential(nn.Linear(z, h), nn.ReLU(), nn.Linear(h, d), nn.Sigmoid())

    def forward(self, x):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.dec(z), mu, logvar


def bernoulli_log_likelihood(x, p, eps=1e-6):
    p = p.clamp(eps, 1 - eps)
    return (x * torch.log(p) + (1 - x) * torch.log(1 - p)).sum(1)


data = make_glyphs(2048)
model = VAE(z=args.latent)
opt = torch.optim.Adam(model.parameters(), lr=args.lr)

bs = 128
for step in range(args.steps):
    x = data[torch.randint(0, data.shape[0], (bs,))]
    p, mu, logvar = model(x)
    rec = bernoulli_log_likelihood(x, p)
    kl = 0.5 * (mu.pow(2) + logvar.exp() - 1 - logvar).sum(1)
    loss = (kl - rec).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 25 == 0:
        saturated = ((p == 0) | (p == 1)).float().mean().item()
        print(f"step {step:4d}  -elbo {loss.item():8.3f}  kl {kl.mean().item():6.3f}  saturated pixels {saturated:.2%}")

print(f"final loss {loss.item():.4f}")
