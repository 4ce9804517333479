# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.addmm.default", "module": "net.2"}
# about: held out (round late 4): a GELU MLP regressor trained with Nesterov SGD under a linear warm-up to a peak lr of 0.6 (x momentum 0.9) that is too high for this un-normalised net; once the warm-up passes the stability limit the loss oscillates and grows and the first inf appears at step 37 in the forward output of the second Linear (net.2).
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def make_data(n, d, gen):
    x = torch.randn(n, d, generator=gen)
    w = torch.randn(d, 1, generator=gen) / math.sqrt(d)
    y = torch.sin(x @ w * 2.0) + 0.5 * (x[:, :4] ** 2).sum(1, keepdim=True) / 4 + 0.05 * torch.randn(n, 1, generator=gen)
    return x, y


class Regressor(nn.Module):
    def __init__(self, d_in, width, depth):
        super().__init__()
        layers = []
        d = d_in
        for _ in range(depth):
            layers += [nn.Linear(d, width), nn.GELU()]
            d = width
        layers.append(nn.Linear(d, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def lr_at(step, peak, warmup, total):
    # linear warm-up then cosine decay (copied from a recipe that used BatchNorm)
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * 0.5 * (1 + math.cos(math.pi * t))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--peak-lr", type=float, default=0.6)
    p.add_argument("--warmup", type=int, default=25)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x, y = make_data(8192, 32, gen)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(1), drop_last=True)

    model = Regressor(32, 256, 3)
    opt = torch.optim.SGD(model.parameters(), lr=args.peak_lr, momentum=0.9, nesterov=True)

    step = 0
    while step < args.steps:
        for xb, yb in loader:
            lr = lr_at(step, args.peak_lr, args.warmup, args.steps)
            for g in opt.param_groups:
                g["lr"] = lr
            pred = model(xb)
            loss = F.mse_loss(pred, yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 10 == 0:
                print(f"step {step:4d} lr {lr:.4f} loss {loss.item():.4f}")
            step += 1
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
