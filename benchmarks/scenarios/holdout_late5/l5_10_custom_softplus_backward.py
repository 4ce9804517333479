# expect: {"cause": "unsafe-op", "phase": "backward", "op": "aten.exp.default", "module": "rate"}
# about: held out (round late 5): trains a Poisson traffic-count regressor whose rate head uses a custom autograd softplus with a hand-written backward exp(x) / (1 + exp(x)); as the pre-activation grows to fit counts of 100+, it passes 88.7 at step 24 and exp overflows to Inf in the backward of rate.
import argparse

import torch
import torch.nn as nn


class PositiveRate(torch.autograd.Function):
    """softplus with a hand-written backward (saves only the input to keep memory low)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.nn.functional.softplus(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        ex = torch.exp(x)
        return grad_out * ex / (1.0 + ex)      # d softplus / dx = sigmoid(x)


class RateHead(nn.Module):
    def __init__(self, d_in):
        super().__init__()
        self.lin = nn.Linear(d_in, 1)

    def forward(self, h):
        return PositiveRate.apply(self.lin(h)).squeeze(-1)


class TrafficModel(nn.Module):
    """Predicts hourly vehicle counts at a sensor from calendar + weather features."""

    def __init__(self, d_in, d_hidden=64):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_hidden), nn.ReLU())
        self.rate = RateHead(d_hidden)

    def forward(self, x):
        return self.rate(self.trunk(x))


def traffic_data(n, gen):
    hour = torch.randint(0, 24, (n,), generator=gen).float()
    dow = torch.randint(0, 7, (n,), generator=gen).float()
    temp = torch.randn(n, generator=gen)
    rain = (torch.rand(n, generator=gen) < 0.2).float()
    feats = torch.stack([torch.sin(hour / 24 * 6.283), torch.cos(hour / 24 * 6.283),
                         torch.sin(dow / 7 * 6.283), torch.cos(dow / 7 * 6.283), temp, rain], 1)
    log_rate = 4.0 + 1.1 * feats[:, 0] + 0.4 * feats[:, 2] - 0.5 * rain + 0.1 * temp
    counts = torch.poisson(torch.exp(log_rate), generator=gen)
    return feats, counts


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-2)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x_all, y_all = traffic_data(20000, gen)

    model = TrafficModel(x_all.shape[1])
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    for step in range(args.steps):
        idx = torch.randint(0, x_all.shape[0], (args.batch_size,), generator=gen)
        x, y = x_all[idx], y_all[idx]
        rate = model(x)
        loss = (rate - y * torch.log(rate)).mean()           # Poisson NLL (up to a constant)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            print(f"step {step:4d} poisson nll {loss.item():.3f} mean rate {rate.mean().item():.1f} "
                  f"max rate {rate.max().item():.1f} mean count {y.mean().item():.1f}")


if __name__ == "__main__":
    main()
