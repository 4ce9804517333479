"""Train an MLP binary classifier on two overlapping 10-D Gaussian blobs with a hand-written BCE.
Latent hazard (line 29): torch.log(1 - torch.sigmoid(z)) -- in float32 sigmoid(z) rounds to exactly 1.0 for
z > ~17, so log(0) = -inf (and log(sigmoid(z)) hits -inf for z < ~-88); the classes overlap, so the
logits stay within about +-6 and neither term has fired yet.
"""
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--lr", type=float, default=3e-3)
args = parser.parse_args()

torch.manual_seed(0)

n, dim = 4096, 10
labels = torch.randint(0, 2, (n,)).float()
direction = torch.randn(dim)
x = torch.randn(n, dim) + (labels[:, None] * 2 - 1) * 0.25 * direction

model = nn.Sequential(nn.Linear(dim, 64), nn.Tanh(), nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=1e-4)

for step in range(args.steps):
    z = model(x).squeeze(-1)
    y = labels
    loss = -(y * torch.log(torch.sigmoid(z)) + (1 - y) * torch.log(1 - torch.sigmoid(z))).mean()

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    if step % 50 == 0:
        acc = ((z > 0).float() == y).float().mean()
        print(f"step {step:4d}  loss {loss.item():.4f}  acc {acc.item():.3f}")
