# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.exp.default", "module": ""}
# about: held out (cure round): MLP VAE on binary 8x8 patterns (BCE-with-logits + KL) with Adam at lr=0.5 instead of a sane 1e-3 (500x); one step pushes fc_logvar outputs into the thousands so std = exp(0.5*logvar) in reparameterize overflows to inf at step 1 and the loss is nan from then on.
"""Small MLP VAE on synthetic 'digit-like' 8x8 binary patterns, Adam, reparameterisation trick."""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"


def make_patterns(n=3000, side=8, n_protos=6, seed=17):
    """Binary 8x8 images: one of a few random prototypes with 8% of the pixels flipped."""
    g = torch.Generator().manual_seed(seed)
    protos = (torch.rand(n_protos, side * side, generator=g) < 0.35).float()
    which = torch.randint(0, n_protos, (n,), generator=g)
    x = protos[which]
    flip = (torch.rand(n, side * side, generator=g) < 0.08).float()
    return (x + flip) % 2


class VAE(nn.Module):
    def __init__(self, d_in=64, hidden=128, z_dim=8):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.fc_mu = nn.Linear(hidden, z_dim)
        self.fc_logvar = nn.Linear(hidden, z_dim)
        self.dec = nn.Sequential(nn.Linear(z_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, d_in))

    def encode(self, x):
        h = self.enc(x)
        return self.fc_mu(h), self.fc_logvar(h)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def forward(self, x):
        mu, logvar = self.encode(x)
        z = self.reparameterize(mu, logvar)
        return self.dec(z), mu, logvar


def vae_loss(recon_logits, x, mu, logvar):
    rec = F.binary_cross_entropy_with_logits(recon_logits, x, reduction="sum") / x.shape[0]
    kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / x.shape[0]
    return rec + kl, rec, kl


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=1e-3 if FIXED else 0.5)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--z-dim", type=int, default=8)
    args = ap.parse_args()

    torch.manual_seed(0)
    data = make_patterns()
    train, test = data[:2500], data[2500:]
    model = VAE(z_dim=args.z_dim)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    torch.manual_seed(123)
    with torch.no_grad():
        recon, mu, logvar = model(test)
        print(f"initial test loss {vae_loss(recon, test, mu, logvar)[0].item():.3f}")
    step = 0
    for epoch in range(args.epochs):
        perm = torch.randperm(train.shape[0])
        for i in range(0, train.shape[0], args.batch):
            x = train[perm[i:i + args.batch]]
            recon, mu, logvar = model(x)
            loss, rec, kl = vae_loss(recon, x, mu, logvar)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f} rec {rec.item():.3f} kl {kl.item():.3f}")
            step += 1

    torch.manual_seed(123)
    with torch.no_grad():
        recon, mu, logvar = model(test)
        final = vae_loss(recon, test, mu, logvar)[0].item()
    print(f"final loss {final}")


if __name__ == "__main__":
    main()
