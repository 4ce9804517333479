"""Train a matrix-factorisation recommender on synthetic implicit feedback with the BPR pairwise loss.
Latent hazard (line 48): torch.log(torch.exp(x) + 1) -- a hand-written softplus; exp overflows to inf in
float32 once a negative item outscores a positive one by ~88 (inf loss, NaN grads); the score gaps stay
within ~10 here, so it has not fired yet.
"""
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--batch-size", type=int, default=512)
parser.add_argument("--reg", type=float, default=1e-4)
args = parser.parse_args()

torch.manual_seed(0)

n_users, n_items, true_dim, dim, top_k = 300, 400, 8, 16, 20
true_u = torch.randn(n_users, true_dim)
true_i = torch.randn(n_items, true_dim)
liked = (true_u @ true_i.T).topk(top_k, dim=1).indices  # each user's "clicked" items


class MF(nn.Module):
    def __init__(self):
        super().__init__()
        self.user = nn.Embedding(n_users, dim)
        self.item = nn.Embedding(n_items, dim)
        nn.init.normal_(self.user.weight, std=0.1)
        nn.init.normal_(self.item.weight, std=0.1)

    def forward(self, u, i):
        return (self.user(u) * self.item(i)).sum(-1)


model = MF()
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

for step in range(args.steps):
    u = torch.randint(0, n_users, (args.batch_size,))
    i_pos = liked[u, torch.randint(0, top_k, (args.batch_size,))]
    i_neg = torch.randint(0, n_items, (args.batch_size,))
    s_pos = model(u, i_pos)
    s_neg = model(u, i_neg)
    x = s_neg - s_pos
    bpr = torch.log(torch.exp(x) + 1).mean()
    l2 = model.user(u).pow(2).sum(-1).mean() + model.item(i_pos).pow(2).sum(-1).mean()
    loss = bpr + args.reg * l2

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    if step % 50 == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}")
