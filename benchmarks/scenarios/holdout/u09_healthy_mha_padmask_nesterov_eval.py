# expect: {"healthy": true}
# about: held out (round 2): written after the code by someone who had not read it or the suite. variable-length sequence classification with nn.MultiheadAttention and a
# key_padding_mask (every sequence keeps >= 3 real tokens, so no row is fully masked), a
# learned [CLS]-style query, SGD(nesterov, momentum 0.9, weight_decay 5e-4), StepLR, grad
# clipping at 1.0, and a torch.no_grad() / model.eval() validation loop every 25 steps.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class PoolAttnClassifier(nn.Module):
    def __init__(self, vocab=50, d=32, heads=4, classes=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.1, batch_first=True)
        self.query = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.norm = nn.LayerNorm(d)
        self.out = nn.Sequential(nn.Dropout(0.1), nn.Linear(d, classes))

    def forward(self, tokens):
        pad = tokens.eq(0)
        h = self.emb(tokens)
        h, _ = self.attn(h, h, h, key_padding_mask=pad)                    # self-attention
        q = self.query.expand(tokens.size(0), -1, -1)
        pooled, _ = self.attn(q, self.norm(h), self.norm(h), key_padding_mask=pad)
        return self.out(pooled.squeeze(1))


def make_split(n, g, L=20):
    lengths = torch.randint(3, L + 1, (n,), generator=g)
    toks = torch.randint(1, 50, (n, L), generator=g)
    toks[torch.arange(L).unsqueeze(0) >= lengths.unsqueeze(1)] = 0
    y = (toks.clamp(max=1).sum(1) * 3 // (L + 1)).clamp(max=2)          # label from length
    return toks, y


def main():
    ap = argparse.ArgumentParser(description="toy classifier")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--eval-every", type=int, default=25)
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    Xtr, ytr = make_split(2000, g)
    Xva, yva = make_split(300, g)
    model = PoolAttnClassifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=60, gamma=0.5)
    for step in range(args.steps):
        model.train()
        i = torch.randint(0, 2000, (32,), generator=g)
        loss = F.cross_entropy(model(Xtr[i]), ytr[i])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if (step + 1) % args.eval_every == 0:
            model.eval()
            with torch.no_grad():
                correct = 0
                for k in range(0, 300, 100):
                    correct += (model(Xva[k:k + 100]).argmax(1) == yva[k:k + 100]).sum().item()
            print(f"step {step + 1:3d} loss {loss.item():.4f} gnorm {gn.item():.3f} val_acc {correct / 300:.3f}")
    print("ok")


if __name__ == "__main__":
    main()
