"""Tiny next-token model on a synthetic order-2 Markov "language": concatenated context
embeddings go through residual MLP blocks with a hand-written RMSNorm, trained with cross-entropy.
Latent hazard (line 18): RMSNorm.forward divides by torch.sqrt(mean(x**2)) with no eps; an all-zero
row gives 0/0 and an infinite sqrt grad, but pre-norm rows are never exactly zero."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * (x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True)))


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = RMSNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class ContextLM(nn.Module):
    def __init__(self, vocab, ctx, dim=64, n_blocks=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, 16)
        self.inp = nn.Linear(16 * ctx, dim)
        self.blocks = nn.Sequential(*[Block(dim) for _ in range(n_blocks)])
        self.final_norm = RMSNorm(dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, ctx_tokens):
        h = self.inp(self.tok(ctx_tokens).flatten(1))
        return self.out(self.final_norm(self.blocks(h)))


def markov_corpus(vocab, length, gen):
    table = torch.softmax(3.0 * torch.randn(vocab, vocab, vocab, generator=gen), dim=-1)
    seq = [0, 1]
    for _ in range(length - 2):
        seq.append(int(torch.multinomial(table[seq[-2], seq[-1]], 1, generator=gen)))
    return torch.tensor(seq)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    vocab, ctx = 20, 6
    corpus = markov_corpus(vocab, 5000, gen)
    contexts = corpus.unfold(0, ctx, 1)[:-1]
    targets = corpus[ctx:]

    model = ContextLM(vocab, ctx)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    for step in range(args.steps):
        ix = torch.randint(0, targets.numel(), (128,), generator=gen)
        loss = F.cross_entropy(model(contexts[ix]), targets[ix])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step} ce {loss.item():.4f}")
    print(f"final ce {loss.item():.4f}")


if __name__ == "__main__":
    main()
