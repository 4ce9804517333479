# expect: {"cause": "unsafe-op", "phase": "backward", "op": "aten.exp.default", "module": "head.1"}
# about: held out (round late 3): a bike-rental count regressor (Poisson NLL, AdamW) whose output uses a custom autograd softplus with a naive backward exp(x)/(1+exp(x)); as the predicted rates climb toward the ~140 targets the pre-activation passes ~88.7 and exp overflows to inf in the backward pass of head.1 at step 25.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class SoftplusFn(torch.autograd.Function):
    """Softplus with a hand-written gradient (sigmoid) to save a kernel launch."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.softplus(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        ex = torch.exp(x)
        return grad_out * ex / (1 + ex)


class PositiveOut(nn.Module):
    def forward(self, x):
        return SoftplusFn.apply(x)


class RentalModel(nn.Module):
    """Predicts hourly bike rentals from weather / calendar features."""

    def __init__(self, d_in=10, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU())
        self.head = nn.Sequential(nn.Linear(hidden, 1), PositiveOut())

    def forward(self, x):
        return self.head(self.body(x)).squeeze(-1)


def make_data(n=4096, d=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    hour = torch.rand(n, generator=g) * 24
    x[:, 0] = torch.sin(hour / 24 * 2 * torch.pi)
    x[:, 1] = torch.cos(hour / 24 * 2 * torch.pi)
    rate = 140 + 60 * x[:, 0] + 25 * torch.tanh(x[:, 2]) - 15 * x[:, 3].abs()
    counts = torch.poisson(rate.clamp(min=5), generator=g)
    return x, counts


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, counts = make_data()
    model = RentalModel()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)

    n = x.shape[0]
    for step in range(args.steps):
        idx = torch.arange(step * args.batch, (step + 1) * args.batch) % n
        rate = model(x[idx])
        loss = F.poisson_nll_loss(rate, counts[idx], log_input=False)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            print(f"step {step:4d} loss {loss.item():.4f} mean rate {rate.mean().item():.1f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
