# expect: {"healthy": true}
# about: held out (round late 2): GRU trained on a "which symbol occurs most often" task with a sequence-length curriculum (8 -> 16 -> 32 -> 64 every 60 steps); the loss jumps back up at every stage switch but every value stays finite.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=240)
parser.add_argument("--lr", type=float, default=3e-3)
args = parser.parse_args()

torch.manual_seed(14)

VOCAB = 4
STAGES = [8, 16, 32, 64]
STEPS_PER_STAGE = 60


def make_batch(length, bs=64):
    # sequences with a (noisy) majority symbol; label = most frequent symbol
    major = torch.randint(0, VOCAB, (bs, 1))
    seq = torch.randint(0, VOCAB, (bs, length))
    bias = torch.rand(bs, length) < 1.0 / length ** 0.5  # longer sequences: weaker majority
    seq = torch.where(bias, major.expand(-1, length), seq)
    counts = F.one_hot(seq, VOCAB).sum(1)
    return seq, counts.argmax(1)


class MajorityGRU(nn.Module):
    def __init__(self, hidden=48):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.gru = nn.GRU(16, hidden, batch_first=True)
        self.out = nn.Linear(hidden, VOCAB)

    def forward(self, seq):
        _, h = self.gru(self.emb(seq))
        return self.out(h[-1])


model = MajorityGRU()
opt = torch.optim.Adam(model.parameters(), lr=args.lr)

for step in range(args.steps):
    length = STAGES[min(step // STEPS_PER_STAGE, len(STAGES) - 1)]
    seq, y = make_batch(length)
    logits = model(seq)
    loss = F.cross_entropy(logits, y)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if step % 10 == 0:
        acc = (logits.argmax(1) == y).float().mean().item()
        print(f"step {step:4d}  len {length:3d}  loss {loss.item():.4f}  acc {acc:.2f}")

print(f"final loss {loss.item():.4f}")
