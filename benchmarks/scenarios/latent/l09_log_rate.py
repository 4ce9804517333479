"""Fit a Poisson regression MLP to store visit counts, where closed stores always record zero visits.
Latent hazard (line 34): torch.log(rate) -- for the structurally-zero (closed) rows the NLL keeps pushing the
softplus rate towards 0, so log(rate) drifts towards -inf (and 0 * -inf = NaN once softplus underflows); the
decay is slow, rate stays far above float32 underflow within 200 steps, so it has not fired yet.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--lr", type=float, default=1e-2)
parser.add_argument("--batch-size", type=int, default=256)
args = parser.parse_args()

torch.manual_seed(0)

n, n_feat = 4096, 6
features = torch.randn(n, n_feat)
is_open = (torch.rand(n) > 0.3).float()
x = torch.cat([features, is_open[:, None]], 1)
true_rate = F.softplus(1.2 * features[:, 0] - 0.6 * features[:, 1] + 1.0) * is_open
visits = torch.poisson(true_rate)

model = nn.Sequential(nn.Linear(n_feat + 1, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

for step in range(args.steps):
    idx = torch.randint(0, n, (args.batch_size,))
    rate = F.softplus(model(x[idx]).squeeze(-1))
    y = visits[idx]
    loss = (rate - y * torch.log(rate)).mean()

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    if step % 50 == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}")
