# expect: {"cause": "optimizer-state", "phase": "optimizer", "op": "aten.div.Tensor", "module": ""}
# about: held out (round late 3): an MLP trained with multi-class hinge loss and a hand-written LARS optimizer whose trust ratio is ||w||/||g|| with no epsilon; once a mini-batch is separated with margin the hinge gradients are exactly zero and the division gives inf (then NaN weights) in the optimizer step at step 43.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class MarginClassifier(nn.Module):
    def __init__(self, d_in=16, hidden=32, n_classes=5):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))

    def forward(self, x):
        return self.net(x)


class LARS:
    """Layer-wise adaptive rate scaling (You et al.), written out by hand."""

    def __init__(self, params, lr=0.1, momentum=0.9, trust_coef=0.02):
        self.params = list(params)
        self.lr, self.momentum, self.trust_coef = lr, momentum, trust_coef
        self.buf = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p, buf in zip(self.params, self.buf):
            g = p.grad
            local_lr = self.trust_coef * p.norm() / g.norm()
            buf.mul_(self.momentum).add_(g * local_lr)
            p.sub_(self.lr * buf)


def make_data(n=2048, d=16, k=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = 1.5 * torch.randn(k, d, generator=g)
    y = torch.randint(0, k, (n,), generator=g)
    x = centres[y] + torch.randn(n, d, generator=g)
    return x, y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, y = make_data()
    model = MarginClassifier()
    opt = LARS(model.parameters(), lr=args.lr)

    n = x.shape[0]
    for step in range(args.steps):
        idx = torch.arange(step * args.batch, (step + 1) * args.batch) % n
        scores = model(x[idx])
        loss = F.multi_margin_loss(scores, y[idx], margin=1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            acc = (scores.argmax(1) == y[idx]).float().mean().item()
            print(f"step {step:4d} loss {loss.item():.4f} acc {acc:.3f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
