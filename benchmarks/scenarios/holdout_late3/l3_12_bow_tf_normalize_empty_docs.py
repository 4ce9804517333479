# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.div.Tensor", "module": "tf"}
# about: held out (round late 3): a bag-of-words MLP text classifier (Adagrad) that turns counts into term frequencies with counts / counts.sum(); the corpus is bucketed longest-first, so the few empty documents only arrive at the end of the epoch and the division gives 0/0 = NaN in the tf module in the forward pass at step 298.
import argparse

import torch
import torch.nn as nn


class TermFrequency(nn.Module):
    """Turns raw token counts into term frequencies."""

    def forward(self, counts):
        return counts / counts.sum(dim=-1, keepdim=True)


class BowClassifier(nn.Module):
    def __init__(self, vocab=500, hidden=64, n_classes=3):
        super().__init__()
        self.tf = TermFrequency()
        self.mlp = nn.Sequential(nn.Linear(vocab, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, n_classes))

    def forward(self, counts):
        return self.mlp(self.tf(counts) * 100.0)


def make_corpus(n_docs=9600, vocab=500, n_classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, n_classes, (n_docs,), generator=g)
    topic = torch.rand(n_classes, vocab, generator=g) ** 4
    topic = topic / topic.sum(1, keepdim=True)
    background = torch.full((vocab,), 1.0 / vocab)
    lengths = torch.randint(3, 120, (n_docs,), generator=g)
    # some documents are nothing but stop words and end up empty after cleaning
    lengths[torch.randperm(n_docs, generator=g)[:40]] = 0
    counts = torch.zeros(n_docs, vocab)
    for i in range(n_docs):
        if lengths[i] > 0:
            probs = 0.6 * topic[labels[i]] + 0.4 * background
            tokens = torch.multinomial(probs, int(lengths[i]), replacement=True, generator=g)
            counts[i].index_add_(0, tokens, torch.ones(int(lengths[i])))
    return counts, labels, lengths


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=320)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    counts, labels, lengths = make_corpus()
    # bucket by length (longest first) so batches have similar sizes
    order = torch.argsort(lengths, descending=True, stable=True)
    counts, labels = counts[order], labels[order]

    model = BowClassifier()
    opt = torch.optim.Adagrad(model.parameters(), lr=args.lr)
    crit = nn.CrossEntropyLoss(label_smoothing=0.05)

    n = counts.shape[0]
    for step in range(args.steps):
        idx = torch.arange(step * args.batch, (step + 1) * args.batch) % n
        logits = model(counts[idx])
        loss = crit(logits, labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step:4d} loss {loss.item():.4f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
