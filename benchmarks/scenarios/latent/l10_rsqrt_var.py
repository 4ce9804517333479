"""Train an MLP with a hand-written LayerNorm to regress a smooth nonlinear function of 8 inputs.
Latent hazard (line 34): torch.rsqrt(var) -- the per-row variance is computed by hand with no eps, so a row whose
pre-activations are all equal (var = 0) gives inf and NaN; the norm sits on the dense linear output of
continuous inputs, so every row's variance stays well above 0 and it has not fired yet.
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

n, dim = 2048, 8
x = torch.randn(n, dim)
y = torch.sin(x[:, 0]) + 0.5 * x[:, 1] * x[:, 2] - 0.3 * x[:, 3] ** 2 + 0.1 * torch.randn(n)


class HandLayerNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(d))
        self.beta = nn.Parameter(torch.zeros(d))

    def forward(self, h):
        mu = h.mean(-1, keepdim=True)
        var = ((h - mu) ** 2).mean(-1, keepdim=True)
        return (h - mu) * torch.rsqrt(var) * self.gamma + self.beta


model = nn.Sequential(
    nn.Linear(dim, 64), HandLayerNorm(64), nn.GELU(),
    nn.Linear(64, 64), HandLayerNorm(64), nn.GELU(),
    nn.Linear(64, 1),
)
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

for step in range(args.steps):
    idx = torch.randint(0, n, (args.batch_size,))
    pred = model(x[idx]).squeeze(-1)
    loss = F.mse_loss(pred, y[idx])

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    if step % 50 == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}")
