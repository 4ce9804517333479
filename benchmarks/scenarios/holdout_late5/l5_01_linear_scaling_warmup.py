# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.addmm.default", "module": "blocks.2"}
# about: held out (round late 5): trains a 4-layer ReLU MLP classifier on raw tabular features with Nesterov SGD whose peak LR comes from the linear scaling rule (0.1*512/32 = 1.6) reached by a 120-step linear warmup; training goes well until the warmup LR passes ~1.3, then the weights diverge and the first Inf appears at step 106 in the forward addmm of blocks.2.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class TabularNet(nn.Module):
    def __init__(self, d_in, d_hidden, n_classes):
        super().__init__()
        self.stem = nn.Linear(d_in, d_hidden)
        self.blocks = nn.Sequential(
            nn.Linear(d_hidden, d_hidden), nn.ReLU(),
            nn.Linear(d_hidden, d_hidden), nn.ReLU(),
        )
        self.head = nn.Linear(d_hidden, n_classes)

    def forward(self, x):
        h = F.relu(self.stem(x))
        h = self.blocks(h)
        return self.head(h)


def make_data(n, d, k, gen):
    centers = torch.randn(k, d, generator=gen) * 0.7
    y = torch.randint(0, k, (n,), generator=gen)
    x = centers[y] + torch.randn(n, d, generator=gen)
    # raw, un-standardised tabular features: a few columns on a large scale
    scale = torch.ones(d)
    scale[: d // 4] = 1.5
    return x * scale, y


def lr_at(step, peak, warmup, total):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return 0.5 * peak * (1 + math.cos(math.pi * t))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--base-lr", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=120)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x, y = make_data(8192, 32, 10, gen)

    model = TabularNet(32, 128, 10)
    # "linear scaling rule": lr grows with the batch size (tuned at batch 32)
    peak_lr = args.base_lr * args.batch_size / 32
    opt = torch.optim.SGD(model.parameters(), lr=peak_lr, momentum=0.9, nesterov=True)

    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (args.batch_size,), generator=gen)
        xb, yb = x[idx], y[idx]
        lr = lr_at(step, peak_lr, args.warmup, args.steps)
        for g in opt.param_groups:
            g["lr"] = lr
        logits = model(xb)
        loss = F.cross_entropy(logits, yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            acc = (logits.argmax(1) == yb).float().mean().item()
            print(f"step {step:4d} lr {lr:.3f} loss {loss.item():.4f} acc {acc:.3f}")


if __name__ == "__main__":
    main()
