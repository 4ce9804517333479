"""Healthy control: train a siamese embedding net on Gaussian clusters with a contrastive loss built on
F.pairwise_distance (which adds eps to the difference), so the distance and its gradient stay finite even
for identical pairs; a fraction of the positive pairs here are in fact identical samples.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--batch-size", type=int, default=128)
parser.add_argument("--margin", type=float, default=2.0)
args = parser.parse_args()

torch.manual_seed(0)

n_clusters, per_cluster, dim, emb_dim = 6, 80, 12, 4
centers = 2.5 * torch.randn(n_clusters, dim)
data = centers.repeat_interleave(per_cluster, 0) + torch.randn(n_clusters * per_cluster, dim)
labels = torch.arange(n_clusters).repeat_interleave(per_cluster)

net = nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, emb_dim))
optimizer = torch.optim.Adam(net.parameters(), lr=args.lr)

for step in range(args.steps):
    i = torch.randint(0, data.shape[0], (args.batch_size,))
    j = torch.randint(0, data.shape[0], (args.batch_size,))
    same = (labels[i] == labels[j]).float()
    # force half of the batch to be positive pairs drawn from the same cluster (possibly the same sample)
    force = torch.rand(args.batch_size) < 0.5
    j = torch.where(force, labels[i] * per_cluster + torch.randint(0, per_cluster, (args.batch_size,)), j)
    same = torch.where(force, torch.ones_like(same), same)

    d = F.pairwise_distance(net(data[i]), net(data[j]))
    loss = (same * d.pow(2) + (1 - same) * torch.relu(args.margin - d).pow(2)).mean()

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    if step % 50 == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}")
