# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": ["aten.native_layer_norm.default", "aten.layer_norm.default"], "module": "blocks.0.ln2"}
# about: held out (lr round): tiny GPT with hand-written causal attention on generated addition facts, AdamW + clip_grad_norm_(1.0), lr typed as 1e3 instead of the intended 1e-3 (10^6x), clipping does not bound Adam's steps and a LayerNorm forward overflows to NaN at step 3.
"""Tiny GPT-style char LM with hand-written causal attention on generated addition facts; AdamW + clipping."""
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"


class Config:
    block = 24
    d = 48
    heads = 4
    layers = 2
    batch = 24
    steps = 200
    lr = 1e-3 if FIXED else 1e3   # meant 1e-3 (sign dropped when copied from the paper table)
    weight_decay = 0.05
    clip = 1.0


def addition_corpus(n=600):
    g = torch.Generator().manual_seed(7)
    a = torch.randint(0, 50, (n,), generator=g)
    b = torch.randint(0, 50, (n,), generator=g)
    return "".join(f"{x}+{y}={x + y};" for x, y in zip(a.tolist(), b.tolist()))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.h = cfg.heads
        self.qkv = nn.Linear(cfg.d, 3 * cfg.d)
        self.proj = nn.Linear(cfg.d, cfg.d)
        self.register_buffer("tril", torch.tril(torch.ones(cfg.block, cfg.block, dtype=torch.bool)))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.h, C // self.h).transpose(1, 2)
        k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, C // self.h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])
        att = att.masked_fill(~self.tril[:T, :T], float("-inf"))
        att = att.softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d)
        self.mlp = nn.Sequential(nn.Linear(cfg.d, 4 * cfg.d), nn.GELU(), nn.Linear(4 * cfg.d, cfg.d))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab, cfg):
        super().__init__()
        self.wte = nn.Embedding(vocab, cfg.d)
        self.wpe = nn.Embedding(cfg.block, cfg.d)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.layers)])
        self.ln_f = nn.LayerNorm(cfg.d)
        self.head = nn.Linear(cfg.d, vocab, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def main():
    cfg = Config()
    torch.manual_seed(0)
    text = addition_corpus()
    vocab = sorted(set(text))
    data = torch.tensor([vocab.index(c) for c in text])
    model = TinyGPT(len(vocab), cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    for step in range(cfg.steps):
        ix = torch.randint(0, len(data) - cfg.block - 1, (cfg.batch,))
        x = torch.stack([data[i:i + cfg.block] for i in ix])
        y = torch.stack([data[i + 1:i + cfg.block + 1] for i in ix])
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, len(vocab)), y.view(-1))
        opt.zero_grad()
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.4f} grad_norm {gnorm.item():.3g}")
    print(f"final loss {loss.item()}")


if __name__ == "__main__":
    main()
