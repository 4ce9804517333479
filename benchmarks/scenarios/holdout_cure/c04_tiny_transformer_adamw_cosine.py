# expect: {"cause": "learning-rate-too-high", "phase": "optimizer", "op": "aten.addcmul_.default", "module": "tok"}
# about: held out (cure round): 2-block pre-LN causal transformer char LM with AdamW (betas 0.9/0.95, wd 0.1) and a 40-step linear warmup + cosine LambdaLR at peak lr=30 instead of a sane 3e-3 (10000x); the loss climbs ~4x per step once the warmup nears its peak, the token-embedding gradient reaches ~1e21 so AdamW's exp_avg_sq overflows to inf around step 41 and the loss is nan from step 45.
"""Tiny causal transformer character LM on a synthetic word corpus, AdamW + linear warmup / cosine decay."""
import argparse
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"

LEXICON = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "red", "big", "box",
           "and", "it", "was", "very", "small", "blue", "sun", "hid", "under", "tree"]


def make_corpus(n_words=6000, seed=3):
    g = torch.Generator().manual_seed(seed)
    # a first-order Markov chain over words so there is structure to learn
    trans = torch.rand(len(LEXICON), len(LEXICON), generator=g) ** 4
    trans = trans / trans.sum(1, keepdim=True)
    w = int(torch.randint(0, len(LEXICON), (1,), generator=g))
    words = []
    for _ in range(n_words):
        words.append(LEXICON[w])
        w = int(torch.multinomial(trans[w], 1, generator=g))
    text = " ".join(words) + "."
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    return data, len(chars)


class Block(nn.Module):
    def __init__(self, d, n_heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, n_heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        x = x + self.mlp(self.ln2(x))
        return x


class CharTransformer(nn.Module):
    def __init__(self, vocab, d=64, n_heads=4, n_layers=2, ctx=32):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList([Block(d, n_heads) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("mask", torch.triu(torch.ones(ctx, ctx, dtype=torch.bool), diagonal=1))

    def forward(self, idx):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T))
        for blk in self.blocks:
            x = blk(x, self.mask[:T, :T])
        return self.head(self.ln_f(x))


def get_batch(data, batch, ctx, gen):
    starts = torch.randint(0, data.numel() - ctx - 1, (batch,), generator=gen)
    x = torch.stack([data[s:s + ctx] for s in starts.tolist()])
    y = torch.stack([data[s + 1:s + ctx + 1] for s in starts.tolist()])
    return x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=3e-3 if FIXED else 30.0)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=32)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--log-every", type=int, default=20)
    args = ap.parse_args()

    torch.manual_seed(0)
    data, vocab = make_corpus()
    n_train = int(0.9 * data.numel())
    train, val = data[:n_train], data[n_train:]
    model = CharTransformer(vocab, ctx=args.ctx)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=args.weight_decay)

    def lr_lambda(step):
        if step < args.warmup:
            return (step + 1) / args.warmup
        progress = (step - args.warmup) / max(1, args.steps - args.warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    gen = torch.Generator().manual_seed(5)
    xv, yv = get_batch(val, 64, args.ctx, torch.Generator().manual_seed(99))

    with torch.no_grad():
        print(f"initial val loss {F.cross_entropy(model(xv).reshape(-1, vocab), yv.reshape(-1)).item():.4f}")
    for step in range(args.steps):
        x, y = get_batch(train, args.batch, args.ctx, gen)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % args.log_every == 0:
            print(f"step {step} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.2e}")

    model.eval()
    with torch.no_grad():
        final = F.cross_entropy(model(xv).reshape(-1, vocab), yv.reshape(-1)).item()
    print(f"final loss {final}")


if __name__ == "__main__":
    main()
