# expect: {"cause": "low-precision-overflow", "phase": "forward", "op": "aten.exp.default", "module": "head"}
# about: held out (round late 5): trains a bag-of-words intent classifier under CPU float16 autocast whose head computes softmax by hand as exp(z) / sum(exp(z)); the logits grow as the intents become separable and at step 138 one passes ~11.1, so the float16 exp in head overflows to Inf.
import argparse

import torch
import torch.nn as nn


class SoftmaxHead(nn.Module):
    """Projection + softmax, written out so the probabilities can be reused for metrics."""

    def __init__(self, d_in, n_cls):
        super().__init__()
        self.proj = nn.Linear(d_in, n_cls)

    def forward(self, h):
        z = self.proj(h)
        e = torch.exp(z)
        return e / e.sum(-1, keepdim=True), z


class IntentClassifier(nn.Module):
    def __init__(self, vocab, d_emb, d_hidden, n_cls):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, d_emb, mode="mean")
        self.encoder = nn.Sequential(nn.Linear(d_emb, d_hidden), nn.GELU(),
                                     nn.Linear(d_hidden, d_hidden), nn.GELU())
        self.head = SoftmaxHead(d_hidden, n_cls)

    def forward(self, tokens):
        return self.head(self.encoder(self.emb(tokens)))


def utterances(n, length, vocab, n_cls, gen):
    """Synthetic intents: each intent has a handful of trigger words mixed into filler."""
    triggers = torch.randint(0, vocab, (n_cls, 6), generator=gen)
    y = torch.randint(0, n_cls, (n,), generator=gen)
    toks = torch.randint(0, vocab, (n, length), generator=gen)
    slots = torch.randint(0, length, (n, 3), generator=gen)
    picks = torch.randint(0, 6, (n, 3), generator=gen)
    toks.scatter_(1, slots, triggers[y[:, None], picks])
    return toks, y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    vocab, n_cls = 500, 8
    toks, y_all = utterances(6400, 12, vocab, n_cls, gen)

    model = IntentClassifier(vocab, 32, 64, n_cls)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)

    step = 0
    for epoch in range(args.epochs):
        perm = torch.randperm(toks.shape[0], generator=gen)
        for i in range(0, toks.shape[0], args.batch_size):
            idx = perm[i:i + args.batch_size]
            x, y = toks[idx], y_all[idx]
            with torch.autocast(device_type="cpu", dtype=torch.float16):
                probs, z = model(x)
                nll = -torch.log(probs.float().gather(1, y[:, None]) + 1e-9).mean()
            opt.zero_grad()
            nll.backward()
            opt.step()
            if step % 25 == 0:
                acc = (probs.argmax(1) == y).float().mean().item()
                print(f"epoch {epoch} step {step:4d} nll {nll.item():.4f} acc {acc:.3f} max logit {z.max().item():.2f}")
            step += 1


if __name__ == "__main__":
    main()
