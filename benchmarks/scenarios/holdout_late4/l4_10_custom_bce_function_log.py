# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.log.default", "module": ""}
# about: held out (round late 4): a click-through model trained with a custom autograd.Function that computes sigmoid + BCE naively as log(p) and log(1-p); as Adam makes the logits confident, sigmoid rounds to exactly 1.0 for a positive example and log(1-p) gives -inf at step 35 inside the Function's forward (outside the model).
import argparse

import torch
import torch.nn as nn


class SigmoidBCE(torch.autograd.Function):
    """Fused sigmoid + binary cross-entropy with the textbook closed-form gradient (p - y)."""

    @staticmethod
    def forward(ctx, logits, targets):
        p = torch.sigmoid(logits)
        ctx.save_for_backward(p, targets)
        loss = -(targets * torch.log(p) + (1 - targets) * torch.log(1 - p))
        return loss.mean()

    @staticmethod
    def backward(ctx, grad_out):
        p, targets = ctx.saved_tensors
        return grad_out * (p - targets) / p.numel(), None


class ClickModel(nn.Module):
    def __init__(self, n_fields, vocab, d_emb=8):
        super().__init__()
        self.emb = nn.Embedding(n_fields * vocab, d_emb)
        self.offsets = torch.arange(n_fields) * vocab
        self.mlp = nn.Sequential(nn.Linear(n_fields * d_emb, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, cats):
        e = self.emb(cats + self.offsets)
        return self.mlp(e.flatten(1)).squeeze(-1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-2)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    n_fields, vocab, n = 6, 20, 30000
    cats = torch.randint(0, vocab, (n, n_fields), generator=gen)
    field_w = torch.randn(n_fields, vocab, generator=gen)
    score = field_w.gather(1, cats.T).sum(0)
    clicks = (score > 0.5).float()
    print(f"click rate {clicks.mean().item():.3f}")

    model = ClickModel(n_fields, vocab)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    batch_gen = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        idx = torch.randint(0, n, (args.batch_size,), generator=batch_gen)
        logits = model(cats[idx])
        loss = SigmoidBCE.apply(logits, clicks[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            print(f"step {step:4d} bce {loss.item():.4f} max |logit| {logits.abs().max().item():.2f}")


if __name__ == "__main__":
    main()
