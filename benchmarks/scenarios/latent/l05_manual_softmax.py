"""Train a one-layer self-attention classifier on toy token sequences (does the sequence hold > 3 'special' tokens?).
Latent hazard (line 41): torch.exp(scores) / torch.exp(scores).sum(-1, keepdim=True) -- a hand-written
softmax without max-subtraction; exp overflows to inf (inf/inf = NaN) once a score passes ~88, but the
scaled dot-product scores stay within a few units here, so it has not fired yet.
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--batch-size", type=int, default=64)
args = parser.parse_args()

torch.manual_seed(0)

vocab, seq_len, d_model = 16, 12, 32
n = 2048
tokens = torch.randint(0, vocab, (n, seq_len))
targets = ((tokens < 4).sum(-1) > 3).long()


class TinyAttentionClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(0.1 * torch.randn(seq_len, d_model))
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.head = nn.Linear(d_model, 2)
        self.scale = 1.0 / math.sqrt(d_model)

    def forward(self, tok):
        h = self.emb(tok) + self.pos
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) * self.scale
        attn = torch.exp(scores) / torch.exp(scores).sum(-1, keepdim=True)
        h = h + self.proj(attn @ v)
        return self.head(torch.relu(h).mean(1))


model = TinyAttentionClassifier()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

for step in range(args.steps):
    idx = torch.randint(0, n, (args.batch_size,))
    logits = model(tokens[idx])
    loss = F.cross_entropy(logits, targets[idx])

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    if step % 50 == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}")
