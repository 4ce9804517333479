"""Healthy control: regress a toy "house price" target from 10 standardised features with an MLP that uses
nn.BatchNorm1d and nn.LayerNorm (both with their built-in eps) and plain F.mse_loss; no hand-written
normalisation, log, exp or division on the loss path.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--batch-size", type=int, default=128)
args = parser.parse_args()

torch.manual_seed(0)

n, dim = 4096, 10
x = torch.randn(n, dim)
w_true = torch.randn(dim) * 0.5
y = x @ w_true + 0.4 * torch.tanh(x[:, 0] * x[:, 1]) + 0.2 * x[:, 2] ** 2 + 0.1 * torch.randn(n)

model = nn.Sequential(
    nn.Linear(dim, 64), nn.BatchNorm1d(64), nn.ReLU(),
    nn.Linear(64, 64), nn.LayerNorm(64), nn.ReLU(),
    nn.Linear(64, 1),
)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)

for step in range(args.steps):
    idx = torch.randint(0, n, (args.batch_size,))
    pred = model(x[idx]).squeeze(-1)
    loss = F.mse_loss(pred, y[idx])

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    if step % 50 == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}")
