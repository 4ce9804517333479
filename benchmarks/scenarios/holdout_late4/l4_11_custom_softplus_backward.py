# expect: {"cause": "unsafe-op", "phase": "backward", "op": "aten.exp.default", "module": "head"}
# about: held out (round late 4): a delivery-time regressor whose head uses a custom softplus autograd.Function with a hand-written backward exp(x)/(1+exp(x)); as the pre-activations grow toward the targets (minutes, up to ~240) one exceeds 88.7 and the backward exp overflows to inf (then inf/inf) at step 84 in head.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class PositiveSoftplus(torch.autograd.Function):
    """softplus with a hand-written derivative (sigmoid written out as e^x / (1 + e^x))."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.softplus(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        ex = torch.exp(x)
        return grad_out * ex / (1 + ex)


class DurationHead(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, 1)

    def forward(self, h):
        return PositiveSoftplus.apply(self.fc(h)).squeeze(-1)


class DeliveryTimeModel(nn.Module):
    def __init__(self, d_in, hidden=96):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.head = DurationHead(hidden)

    def forward(self, x):
        return self.head(self.backbone(x))


def make_orders(n, gen):
    dist_km = 30 * torch.rand(n, generator=gen) ** 2
    items = torch.randint(1, 30, (n,), generator=gen).float()
    rush = (torch.rand(n, generator=gen) < 0.3).float()
    rural = (torch.rand(n, generator=gen) < 0.15).float()
    noise = torch.randn(n, 8, generator=gen)
    minutes = 10 + 3.0 * dist_km * (1 + rural) + 0.8 * items + 25 * rush + 5 * noise[:, 0].abs()
    x = torch.stack([dist_km / 10, items / 10, rush, rural], 1)
    return torch.cat([x, noise], 1), minutes


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x, y = make_orders(10000, gen)
    print(f"delivery minutes: mean {y.mean().item():.1f}, max {y.max().item():.1f}")
    model = DeliveryTimeModel(x.shape[1])
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    batch_gen = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        idx = torch.randint(0, len(x), (args.batch_size,), generator=batch_gen)
        pred = model(x[idx])
        loss = F.smooth_l1_loss(pred, y[idx], beta=5.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            print(f"step {step:4d} huber {loss.item():.3f} max pred {pred.max().item():.1f}")


if __name__ == "__main__":
    main()
