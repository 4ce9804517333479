"""Dual-encoder retrieval: bag-of-tokens query and document towers (EmbeddingBag + MLP) trained
with an in-batch InfoNCE loss on synthetic (query, document) pairs.
Latent hazard (line 28): cosine_matrix() divides by the product of hand-computed norms with no eps, so
a zero embedding would give 0/0; the towers end in a biased Linear, so no vector is ever exactly 0."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 300
DOC_LEN = 12
QUERY_LEN = 6


class Tower(nn.Module):
    def __init__(self, vocab, dim=48, out=32):
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.proj = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, out))

    def forward(self, tokens):
        return self.proj(self.bag(tokens))


def cosine_matrix(a, b):
    dots = a @ b.t()
    return dots / (a.norm(dim=-1).unsqueeze(1) * b.norm(dim=-1).unsqueeze(0))


def sample_pairs(batch, gen):
    docs = torch.randint(0, VOCAB, (batch, DOC_LEN), generator=gen)
    pick = torch.argsort(torch.rand(batch, DOC_LEN, generator=gen), dim=1)[:, :QUERY_LEN]
    queries = torch.gather(docs, 1, pick)
    # replace a fifth of the query tokens with noise
    noise = torch.randint(0, VOCAB, queries.shape, generator=gen)
    swap = torch.rand(queries.shape, generator=gen) < 0.2
    queries = torch.where(swap, noise, queries)
    return queries, docs


class Retriever(nn.Module):
    def __init__(self, temperature=0.07):
        super().__init__()
        self.q_tower = Tower(VOCAB)
        self.d_tower = Tower(VOCAB)
        self.temperature = temperature

    def forward(self, queries, docs):
        sim = cosine_matrix(self.q_tower(queries), self.d_tower(docs))
        logits = sim / self.temperature
        labels = torch.arange(queries.shape[0])
        return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = Retriever()
    optim = torch.optim.Adam(model.parameters(), lr=5e-3)

    for it in range(args.steps):
        q, d = sample_pairs(args.batch, gen)
        loss = model(q, d)
        optim.zero_grad()
        loss.backward()
        optim.step()
        if it % 50 == 0:
            print(f"it={it} infonce={loss.item():.4f}")
    print(f"it={args.steps} infonce={loss.item():.4f}")


if __name__ == "__main__":
    main()
