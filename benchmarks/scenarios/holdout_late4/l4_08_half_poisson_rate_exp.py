# expect: {"cause": "low-precision-overflow", "phase": "forward", "op": "aten.exp.default", "module": "head"}
# about: held out (round late 4): a Poisson count model converted to .half() with an exp rate head, trained with SGD+momentum on counts up to ~250k; the predicted log-rate climbs during training and at step 32 exp(log_rate) exceeds the float16 maximum (log-rate > 11.09) and becomes inf in head, while the same model in float32 stays finite.
import argparse

import torch
import torch.nn as nn


class PoissonHead(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = nn.Linear(d, 1)

    def forward(self, h):
        log_rate = self.proj(h).squeeze(-1)
        return torch.exp(log_rate), log_rate


class CountModel(nn.Module):
    def __init__(self, d_in, hidden=64):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.head = PoissonHead(hidden)

    def forward(self, x):
        return self.head(self.encoder(x))


def make_counts(n, gen):
    # hourly ticket scans at stations of very different size
    x = torch.randn(n, 12, generator=gen)
    station_size = x[:, 0] * 0.9 + x[:, 1] * 0.6
    log_mu = 8.0 + station_size + 0.3 * torch.sin(2 * x[:, 2])
    y = torch.poisson(torch.exp(log_mu), generator=gen)
    return x, y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-6)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x, y = make_counts(20000, gen)
    print(f"counts: median {y.median().item():.0f}, max {y.max().item():.0f}")

    # whole model in float16 to halve memory
    model = CountModel(12).half()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    batch_gen = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        idx = torch.randint(0, len(x), (args.batch_size,), generator=batch_gen)
        xb, yb = x[idx].half(), y[idx]
        rate, log_rate = model(xb)
        # Poisson NLL (without the constant log y! term), accumulated in float32
        loss = (rate.float() - yb * log_rate.float()).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            print(f"step {step:4d} nll {loss.item():.1f} max rate {rate.max().item():.0f}")


if __name__ == "__main__":
    main()
