"""Healthy control: a 2-layer pre-norm transformer classifies variable-length token sequences by whether
marker token A occurs more often than marker token B; attention uses F.scaled_dot_product_attention with a padding mask,
blocks use nn.LayerNorm, and pooling uses an RMSNorm written with torch.rsqrt(ms + eps)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, MAXLEN, A, B, PAD = 30, 20, 1, 2, 0


class SafeRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.g = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.g * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class EncoderBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, attn_mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.ff(self.ln2(x))


class SeqClassifier(nn.Module):
    def __init__(self, d=32, heads=4, layers=2):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(0.02 * torch.randn(MAXLEN, d))
        self.blocks = nn.ModuleList(EncoderBlock(d, heads) for _ in range(layers))
        self.norm = SafeRMSNorm(d)
        self.out = nn.Linear(d, 2)

    def forward(self, tokens):
        keep = tokens != PAD                                  # (B, T); position 0 is never PAD
        attn_mask = keep[:, None, None, :]                    # bool, True = attend
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        for blk in self.blocks:
            x = blk(x, attn_mask)
        w = keep.unsqueeze(-1).float()
        pooled = (x * w).sum(1) / w.sum(1)                   # w.sum(1) >= 8 by construction
        return self.out(self.norm(pooled))


def make_batch(n, gen):
    lengths = torch.randint(8, MAXLEN + 1, (n,), generator=gen)
    toks = torch.randint(3, VOCAB, (n, MAXLEN), generator=gen)
    pos = torch.argsort(torch.rand(n, MAXLEN, generator=gen), dim=1)
    labels = torch.randint(0, 2, (n,), generator=gen)
    for i in range(n):
        L = int(lengths[i])
        slots = pos[i][pos[i] < L][:5]
        many, few = (A, B) if labels[i] == 1 else (B, A)
        toks[i, slots[:3]] = many
        toks[i, slots[3:]] = few
        toks[i, L:] = PAD
    return toks, labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = SeqClassifier()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=max(args.steps, 1))
    for step in range(args.steps):
        toks, labels = make_batch(48, gen)
        loss = F.cross_entropy(model(toks), labels, label_smoothing=0.05)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0:
            print(f"step {step} ce {loss.item():.4f}")
    print(f"final ce {loss.item():.4f}")


if __name__ == "__main__":
    main()
