"""Estimate mutual information between two correlated Gaussian vectors with MINE (Donsker-Varadhan bound).
Latent hazard (line 47): torch.exp(t_marg) -- the critic output is exponentiated raw; float32 exp overflows
to inf for t > ~88 and the critic's outputs grow as the bound tightens, but here they stay in the single
digits, so it has not fired yet.
"""
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--batch-size", type=int, default=256)
args = parser.parse_args()

torch.manual_seed(0)

dim, rho, n = 4, 0.8, 4096
xs = torch.randn(n, dim)
ys = rho * xs + (1 - rho ** 2) ** 0.5 * torch.randn(n, dim)


class Critic(nn.Module):
    def __init__(self, dim, hidden=64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(2 * dim, hidden), nn.ELU(),
            nn.Linear(hidden, hidden), nn.ELU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, x, y):
        return self.net(torch.cat([x, y], -1)).squeeze(-1)


critic = Critic(dim)
optimizer = torch.optim.Adam(critic.parameters(), lr=args.lr)

for step in range(args.steps):
    idx = torch.randint(0, n, (args.batch_size,))
    x, y = xs[idx], ys[idx]
    y_shuffled = y[torch.randperm(args.batch_size)]

    t_joint = critic(x, y)
    t_marg = critic(x, y_shuffled)
    mi_lower_bound = t_joint.mean() - torch.log(torch.exp(t_marg).mean())
    loss = -mi_lower_bound

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    if step % 50 == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}  mi_est {mi_lower_bound.item():.4f}")
