# expect: {"healthy": true}
# about: held out (round late 4): a ReZero residual classifier with a zero-initialised head and zero residual gates on linearly separable data, so weights and gates grow from exactly 0 and the logits keep growing past 100 as the loss goes to ~1e-4, but nothing overflows.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class ReZeroBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.alpha = nn.Parameter(torch.zeros(1))  # residual branch starts switched off

    def forward(self, x):
        return x + self.alpha * self.fc2(F.gelu(self.fc1(x)))


class SeparableClassifier(nn.Module):
    def __init__(self, d_in, d=32, n_classes=4, depth=3):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.blocks = nn.Sequential(*[ReZeroBlock(d) for _ in range(depth)])
        self.head = nn.Linear(d, n_classes)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x):
        return self.head(self.blocks(self.inp(x)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    # linearly separable 4-class data with a clear margin: the CE optimum is at infinity
    n, d_in = 4000, 12
    w_true = torch.randn(d_in, 4, generator=gen)
    x = torch.randn(n, d_in, generator=gen)
    scores = x @ w_true
    top2 = scores.topk(2, dim=1).values
    keep = (top2[:, 0] - top2[:, 1]) > 0.5
    x, y = x[keep], scores[keep].argmax(1)
    print(f"{len(x)} separable points")

    model = SeparableClassifier(d_in)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    batch_gen = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        idx = torch.randint(0, len(x), (args.batch_size,), generator=batch_gen)
        logits = model(x[idx])
        loss = F.cross_entropy(logits, y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            alphas = [round(b.alpha.item(), 3) for b in model.blocks]
            print(f"step {step:4d} loss {loss.item():.2e} head |W| {model.head.weight.norm().item():7.2f} "
                  f"max logit {logits.abs().max().item():7.1f} alphas {alphas}")


if __name__ == "__main__":
    main()
