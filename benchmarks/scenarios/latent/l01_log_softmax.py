"""Train a small MLP classifier on four overlapping 2-D Gaussian blobs with a hand-written cross-entropy.
Latent hazard (line 35): torch.log(torch.softmax(logits, -1)) -- softmax underflows to exactly 0 once a
logit trails the max by ~104, giving log(0) = -inf (and -inf * 0 = NaN for the off-target entries); the
largest logit gap reached here is ~35, so it has not fired yet.
"""
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--batch-size", type=int, default=128)
args = parser.parse_args()

torch.manual_seed(0)

n_per_class, n_classes, dim = 256, 4, 2
centers = torch.tensor([[2.0, 2.0], [-2.0, 2.0], [-2.0, -2.0], [2.0, -2.0]])
x = torch.cat([centers[c] + 1.3 * torch.randn(n_per_class, dim) for c in range(n_classes)])
y = torch.arange(n_classes).repeat_interleave(n_per_class)
onehot = nn.functional.one_hot(y, n_classes).float()

model = nn.Sequential(
    nn.Linear(dim, 64), nn.ReLU(),
    nn.Linear(64, 64), nn.ReLU(),
    nn.Linear(64, n_classes),
)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

for step in range(args.steps):
    idx = torch.randint(0, x.shape[0], (args.batch_size,))
    logits = model(x[idx])
    loss = -(torch.log(torch.softmax(logits, -1)) * onehot[idx]).sum(-1).mean()

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    if step % 50 == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}")
