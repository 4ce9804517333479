# expect: {"healthy": true}
# about: held out (round late 3): a 2-layer Transformer encoder sequence classifier with AdamW, a 60-step warm-up to a large peak lr (0.06) and cosine decay; the loss spikes (to ~1.35) around the peak and then recovers, with no non-finite value.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class SeqClassifier(nn.Module):
    def __init__(self, vocab=12, d_model=32, n_heads=4, n_layers=2, max_len=16, n_classes=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(0.02 * torch.randn(max_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, n_heads, dim_feedforward=64, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.cls = nn.Linear(d_model, n_classes)

    def forward(self, tokens):
        h = self.encoder(self.tok(tokens) + self.pos[: tokens.shape[1]])
        return self.cls(h.mean(dim=1))


def make_batch(batch, length, g):
    tokens = torch.randint(0, 12, (batch, length), generator=g)
    # label: does a 3 appear somewhere before a 7?
    pos3 = torch.where(tokens == 3, torch.arange(length), length).min(1).values
    has7_after = torch.zeros(batch, dtype=torch.bool)
    for b in range(batch):
        later = tokens[b, pos3[b] + 1:] if pos3[b] < length else tokens[b, :0]
        has7_after[b] = (later == 7).any()
    return tokens, has7_after.long()


def lr_lambda(step, warmup, total):
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * progress))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=6e-2, help="peak lr after warm-up")
    p.add_argument("--warmup", type=int, default=60)
    p.add_argument("--batch", type=int, default=32)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    model = SeqClassifier()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_lambda(s, args.warmup, args.steps))

    for step in range(args.steps):
        tokens, labels = make_batch(args.batch, 16, g)
        loss = F.cross_entropy(model(tokens), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 20 == 0:
            print(f"step {step:4d} lr {sched.get_last_lr()[0]:.5f} loss {loss.item():.4f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
