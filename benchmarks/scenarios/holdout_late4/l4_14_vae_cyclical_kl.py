# expect: {"healthy": true}
# about: held out (round late 4): a VAE on binary bar images with cyclical KL annealing, so the total loss and the KL term jump up every time beta ramps (and log-variances dip to about -7), but it stays finite.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def make_bar_images(n, gen, size=10):
    # binary images made of 1-3 random horizontal / vertical bars
    imgs = torch.zeros(n, size, size)
    n_bars = torch.randint(1, 4, (n,), generator=gen)
    for i in range(n):
        for _ in range(int(n_bars[i])):
            pos = int(torch.randint(0, size, (1,), generator=gen))
            if torch.rand(1, generator=gen).item() < 0.5:
                imgs[i, pos, :] = 1.0
            else:
                imgs[i, :, pos] = 1.0
    flip = torch.rand(n, size, size, generator=gen) < 0.02
    imgs = torch.where(flip, 1 - imgs, imgs)
    return imgs.flatten(1)


class VAE(nn.Module):
    def __init__(self, d_in=100, hidden=128, z_dim=6):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.mu = nn.Linear(hidden, z_dim)
        self.logvar = nn.Linear(hidden, z_dim)
        self.dec = nn.Sequential(nn.Linear(z_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, d_in))

    def forward(self, x, eps):
        h = self.enc(x)
        mu, logvar = self.mu(h), self.logvar(h)
        z = mu + torch.exp(0.5 * logvar) * eps
        return self.dec(z), mu, logvar


def kl_weight(step, cycle=200, ramp=0.5):
    # cyclical annealing: beta ramps 0 -> 1 over the first half of every cycle, then stays at 1
    t = (step % cycle) / cycle
    return min(1.0, t / ramp)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    data = make_bar_images(3000, gen)
    model = VAE()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    batch_gen = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        idx = torch.randint(0, len(data), (args.batch_size,), generator=batch_gen)
        x = data[idx]
        eps = torch.randn(args.batch_size, 6, generator=batch_gen)
        logits, mu, logvar = model(x, eps)
        recon = F.binary_cross_entropy_with_logits(logits, x, reduction="sum") / args.batch_size
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / args.batch_size
        beta = kl_weight(step)
        loss = recon + beta * kl
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step:4d} beta {beta:.2f} loss {loss.item():8.3f} recon {recon.item():8.3f} "
                  f"kl {kl.item():8.3f} min logvar {logvar.min().item():.2f}")


if __name__ == "__main__":
    main()
