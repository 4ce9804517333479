# expect: {"healthy": true}
# about: held out (round late 2): 2-layer Transformer encoder classifying whether a token pattern occurs in a sequence, with linear LR warmup to a sane peak (1e-3) and cosine decay; the loss wobbles upward around the peak LR but all values stay finite.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--peak-lr", type=float, default=1e-3)
parser.add_argument("--warmup", type=int, default=60)
args = parser.parse_args()

torch.manual_seed(17)

VOCAB, L = 12, 24
PATTERN = torch.tensor([3, 7, 5])


def make_batch(bs=64):
    seq = torch.randint(0, VOCAB, (bs, L))
    plant = torch.rand(bs) < 0.5
    pos = torch.randint(0, L - 3, (bs,))
    for i in torch.nonzero(plant).flatten().tolist():
        seq[i, pos[i]:pos[i] + 3] = PATTERN
    windows = seq.unfold(1, 3, 1)
    label = (windows == PATTERN).all(-1).any(-1).long()
    return seq, label


class PatternTransformer(nn.Module):
    def __init__(self, d=48, heads=4, layers=2):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.randn(L, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=96, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.cls = nn.Linear(d, 2)

    def forward(self, seq):
        h = self.encoder(self.tok(seq) + self.pos)
        return self.cls(h.mean(1))


def lr_lambda(step):
    if step < args.warmup:
        return (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return 0.5 * (1 + math.cos(math.pi * progress))


model = PatternTransformer()
opt = torch.optim.AdamW(model.parameters(), lr=args.peak_lr, weight_decay=0.01)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)

for step in range(args.steps):
    seq, y = make_batch()
    logits = model(seq)
    loss = F.cross_entropy(logits, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    if step % 20 == 0:
        acc = (logits.argmax(1) == y).float().mean().item()
        print(f"step {step:4d}  lr {sched.get_last_lr()[0]:.2e}  loss {loss.item():.4f}  acc {acc:.2f}")

print(f"final loss {loss.item():.4f}")
