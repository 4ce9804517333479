# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.exp.default", "module": "quantizer"}
# about: held out (round late 3): a discrete (Gumbel-softmax) autoencoder whose temperature is annealed as exp(-0.005*step) with a hand-written softmax (no max subtraction); as tau shrinks and the code logits grow, exp((logits+g)/tau) in the quantizer overflows to inf in the forward pass at step 240.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class GumbelSoftmax(nn.Module):
    def forward(self, logits, tau):
        u = torch.rand_like(logits).clamp(1e-10, 1.0)
        gumbel = -torch.log(-torch.log(u))
        y = torch.exp((logits + gumbel) / tau)
        return y / y.sum(dim=-1, keepdim=True)


class DiscreteAutoencoder(nn.Module):
    def __init__(self, d_x=24, n_codes=4, n_cats=8, hidden=64):
        super().__init__()
        self.n_codes, self.n_cats = n_codes, n_cats
        self.encoder = nn.Sequential(nn.Linear(d_x, hidden), nn.ReLU(), nn.Linear(hidden, n_codes * n_cats))
        self.quantizer = GumbelSoftmax()
        self.decoder = nn.Sequential(nn.Linear(n_codes * n_cats, hidden), nn.ReLU(), nn.Linear(hidden, d_x))

    def forward(self, x, tau):
        logits = self.encoder(x).view(-1, self.n_codes, self.n_cats)
        codes = self.quantizer(logits, tau)
        return self.decoder(codes.flatten(1)), logits


def make_data(n=2048, d_x=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    # data generated from 4 discrete factors with 8 values each
    factors = torch.randint(0, 8, (n, 4), generator=g)
    table = torch.randn(4, 8, d_x, generator=g)
    x = sum(table[k][factors[:, k]] for k in range(4))
    return x + 0.1 * torch.randn(n, d_x, generator=g)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--anneal", type=float, default=0.005, help="tau = exp(-anneal * step)")
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = make_data()
    model = DiscreteAutoencoder()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    n = data.shape[0]
    for step in range(args.steps):
        tau = math.exp(-args.anneal * step)
        idx = torch.arange(step * args.batch, (step + 1) * args.batch) % n
        x = data[idx]
        recon, logits = model(x, tau)
        q = F.softmax(logits, dim=-1)
        # reconstruction + a small entropy bonus keeping codes in use
        loss = F.mse_loss(recon, x) + 0.01 * (q * torch.log(q + 1e-9)).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step:4d} tau {tau:.4f} loss {loss.item():.4f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
