# expect: {"healthy": true}
# about: held out (round late 3): a zero-initialised logistic-regression spam filter on separable data with SGD(lr=2); the weight norm (to ~14) and the largest logit (to ~55) keep growing while the loss heads toward 0, but binary_cross_entropy_with_logits stays finite.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class SpamFilter(nn.Module):
    def __init__(self, d_in=30):
        super().__init__()
        self.linear = nn.Linear(d_in, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x):
        return self.linear(x).squeeze(-1)


def make_data(n=2000, d=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    w_true = torch.randn(d, generator=g)
    x = torch.randn(n, d, generator=g)
    margin = x @ w_true
    keep = margin.abs() > 0.5  # linearly separable with a gap
    x, margin = x[keep], margin[keep]
    return x, (margin > 0).float()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--lr", type=float, default=2.0)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, y = make_data()
    model = SpamFilter()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    for step in range(args.steps):
        logits = model(x)
        loss = F.binary_cross_entropy_with_logits(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0:
            print(f"step {step:5d} loss {loss.item():.6f} |w| {model.linear.weight.norm().item():.2f} max logit {logits.abs().max().item():.1f}")
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
