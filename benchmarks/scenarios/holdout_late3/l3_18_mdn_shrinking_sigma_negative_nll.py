# expect: {"healthy": true}
# about: held out (round late 3): a mixture density network on the two-branch target y = +-sqrt(x) with tiny noise; the sigmas shrink toward ~4e-3 and the NLL goes negative and noisy, but sigma = softplus + 1e-4 keeps the log finite.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MixtureDensityNet(nn.Module):
    def __init__(self, n_components=5, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.logits = nn.Linear(hidden, n_components)
        self.mu = nn.Linear(hidden, n_components)
        self.sigma_raw = nn.Linear(hidden, n_components)

    def forward(self, x):
        h = self.body(x)
        sigma = F.softplus(self.sigma_raw(h)) + 1e-4
        return self.logits(h), self.mu(h), sigma


def mdn_nll(logits, mu, sigma, y):
    log_pi = F.log_softmax(logits, dim=-1)
    log_norm = -0.5 * ((y - mu) / sigma) ** 2 - torch.log(sigma) - 0.5 * math.log(2 * math.pi)
    return -torch.logsumexp(log_pi + log_norm, dim=-1).mean()


def make_data(n=2048, seed=0):
    g = torch.Generator().manual_seed(seed)
    # two-branch target: y = +-sqrt(x), measured very precisely
    x = torch.rand(n, 1, generator=g)
    branch = torch.randint(0, 2, (n, 1), generator=g).float() * 2 - 1
    y = branch * torch.sqrt(x) + 0.001 * torch.randn(n, 1, generator=g)
    return x, y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, y = make_data()
    model = MixtureDensityNet()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    n = x.shape[0]
    for step in range(args.steps):
        idx = torch.arange(step * args.batch, (step + 1) * args.batch) % n
        logits, mu, sigma = model(x[idx])
        loss = mdn_nll(logits, mu, sigma, y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step:4d} nll {loss.item():.4f} min sigma {sigma.min().item():.2e}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
