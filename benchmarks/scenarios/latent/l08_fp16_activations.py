"""Regress daily sales from raw (unscaled) traffic counts with an MLP whose first hidden activations are kept in float16.
Latent hazard (line 36): self.fc1(x).to(torch.float16) -- the inputs are raw counts (hundreds to thousands),
so the first-layer pre-activations reach the thousands and grow as fc1 trains; float16 overflows to inf above
65504, but they stay well below that within 200 steps, so it has not fired yet.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--batch-size", type=int, default=128)
args = parser.parse_args()

torch.manual_seed(0)

n, n_feat = 2048, 8
rates = torch.tensor([150.0, 360.0, 900.0, 240.0, 1500.0, 60.0, 600.0, 450.0])
counts = torch.poisson(rates * torch.rand(n, n_feat) * 2.0)
true_w = torch.randn(n_feat) * 0.01
sales = counts @ true_w + 5.0 + torch.randn(n)


class SalesMLP(nn.Module):
    def __init__(self, hidden=128):
        super().__init__()
        self.fc1 = nn.Linear(n_feat, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        # keep the wide hidden activations in half precision to save memory
        h = torch.relu(self.fc1(x).to(torch.float16))
        h = torch.relu(self.fc2(h.float()))
        return self.head(h).squeeze(-1)


model = SalesMLP()
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

for step in range(args.steps):
    idx = torch.randint(0, n, (args.batch_size,))
    pred = model(counts[idx])
    loss = F.mse_loss(pred, sales[idx])

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    if step % 50 == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}")
