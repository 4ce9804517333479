"""Healthy control: train a click-through-rate model (user/item embeddings + dense features) with
F.binary_cross_entropy_with_logits, which uses the stable log-sum-exp form internally, so there is no
log(sigmoid) / log(1 - sigmoid) underflow on the loss path.
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

n, n_users, n_items, n_dense, emb = 8192, 500, 200, 4, 8
users = torch.randint(0, n_users, (n,))
items = torch.randint(0, n_items, (n,))
dense = torch.randn(n, n_dense)
user_bias = 0.8 * torch.randn(n_users)
item_bias = 0.8 * torch.randn(n_items)
true_logit = user_bias[users] + item_bias[items] + dense @ torch.tensor([0.7, -0.4, 0.2, 0.0]) - 1.5
clicks = torch.bernoulli(torch.sigmoid(true_logit))


class CTRModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.user = nn.Embedding(n_users, emb)
        self.item = nn.Embedding(n_items, emb)
        self.mlp = nn.Sequential(nn.Linear(2 * emb + n_dense, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, u, i, d):
        return self.mlp(torch.cat([self.user(u), self.item(i), d], -1)).squeeze(-1)


model = CTRModel()
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

for step in range(args.steps):
    idx = torch.randint(0, n, (args.batch_size,))
    logits = model(users[idx], items[idx], dense[idx])
    loss = F.binary_cross_entropy_with_logits(logits, clicks[idx])

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    if step % 50 == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}")
