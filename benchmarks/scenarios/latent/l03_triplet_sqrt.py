"""Learn a metric embedding of 8 Gaussian clusters in 16-D with a hand-written triplet margin loss.
Latent hazard (line 30): ((a - b) ** 2).sum(-1).sqrt() -- no eps, so the gradient 0.5/sqrt(s) is inf
(0 * inf = NaN) whenever an anchor/positive pair coincides; positives are always a *different* noisy
sample of the same cluster, so every distance stays > 0 and it has not fired yet.
"""
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--batch-size", type=int, default=128)
parser.add_argument("--margin", type=float, default=1.0)
args = parser.parse_args()

torch.manual_seed(0)

n_clusters, per_cluster, dim, emb_dim = 8, 64, 16, 8
centers = 0.8 * torch.randn(n_clusters, dim)
data = centers.repeat_interleave(per_cluster, 0) + torch.randn(n_clusters * per_cluster, dim)
labels = torch.arange(n_clusters).repeat_interleave(per_cluster)

net = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, emb_dim))
optimizer = torch.optim.Adam(net.parameters(), lr=args.lr)


def euclidean(a, b):
    return ((a - b) ** 2).sum(-1).sqrt()


def sample_triplets(batch_size):
    anchor = torch.randint(0, data.shape[0], (batch_size,))
    cls = labels[anchor]
    within = anchor % per_cluster
    offset = torch.randint(1, per_cluster, (batch_size,))
    positive = cls * per_cluster + (within + offset) % per_cluster
    neg_cls = (cls + torch.randint(1, n_clusters, (batch_size,))) % n_clusters
    negative = neg_cls * per_cluster + torch.randint(0, per_cluster, (batch_size,))
    return anchor, positive, negative


for step in range(args.steps):
    a_idx, p_idx, n_idx = sample_triplets(args.batch_size)
    ea, ep, en = net(data[a_idx]), net(data[p_idx]), net(data[n_idx])
    d_ap = euclidean(ea, ep)
    d_an = euclidean(ea, en)
    loss = torch.relu(d_ap - d_an + args.margin).mean()

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    if step % 50 == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}  d_ap {d_ap.mean().item():.3f}  d_an {d_an.mean().item():.3f}")
