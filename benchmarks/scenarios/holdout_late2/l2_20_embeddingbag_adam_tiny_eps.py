# expect: {"healthy": true}
# about: held out (round late 2): bag-of-words sentiment classifier (EmbeddingBag) trained with Adam(eps=1e-16); most vocabulary rows never appear in the data and get exactly-zero gradients, but the tiny non-zero eps keeps 0/(0+eps)=0, so no non-finite value appears over the whole run.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--lr", type=float, default=5e-3)
args = parser.parse_args()

torch.manual_seed(20)

VOCAB = 5000        # tokenizer vocabulary
USED = 600          # the toy corpus only ever uses the first 600 ids
DOC_LEN = 30

polarity = torch.randn(USED)  # latent sentiment of each used word


def make_docs(bs):
    # documents mix common words (low ids) and a few rare ones; label from summed polarity
    common = torch.randint(0, 100, (bs, DOC_LEN - 5))
    rare = torch.randint(100, USED, (bs, 5))
    docs = torch.cat([common, rare], 1)
    label = (polarity[docs].sum(1) > 0).long()
    return docs, label


class BowClassifier(nn.Module):
    def __init__(self, vocab, dim=32):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, docs):
        return self.mlp(self.bag(docs))


model = BowClassifier(VOCAB)
# "match the reference implementation": epsilon made as small as possible
opt = torch.optim.Adam(model.parameters(), lr=args.lr, eps=1e-16)

for step in range(args.steps):
    docs, y = make_docs(64)
    logits = model(docs)
    loss = F.cross_entropy(logits, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 25 == 0:
        zero_rows = (model.bag.weight.grad.abs().sum(1) == 0).sum().item()
        acc = (logits.argmax(1) == y).float().mean().item()
        print(f"step {step:4d}  loss {loss.item():.4f}  acc {acc:.2f}  rows with zero grad {zero_rows}/{VOCAB}")

print(f"final loss {loss.item():.4f}")
