# expect: {"healthy": true}
# about: held out (round late 4): a mean/variance regression net trained with a Gaussian NLL on data where half the targets are noise-free, so the predicted variance shrinks toward its 1e-6 floor (softplus + 1e-6) under the log, the loss goes negative and gradient norms spike into the hundreds, yet everything stays finite.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

MIN_VAR = 1e-6


class MeanVarianceNet(nn.Module):
    def __init__(self, d_in, hidden=64):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.mean = nn.Linear(hidden, 1)
        self.raw_var = nn.Linear(hidden, 1)

    def forward(self, x):
        h = self.trunk(x)
        var = F.softplus(self.raw_var(h)) + MIN_VAR  # floored: never below 1e-6
        return self.mean(h).squeeze(-1), var.squeeze(-1)


def make_sensor_data(n, gen):
    # half of the readings come from a digital sensor that reports the exact value (zero noise)
    x = torch.rand(n, 3, generator=gen) * 2 - 1
    exact = x[:, 2] > 0
    clean = torch.sin(2.5 * x[:, 0]) + 0.5 * x[:, 1]
    noise = 0.3 * torch.randn(n, generator=gen)
    y = torch.where(exact, clean, clean + noise)
    return x, y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=900)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x, y = make_sensor_data(6000, gen)
    model = MeanVarianceNet(3)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    batch_gen = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        idx = torch.randint(0, len(x), (args.batch_size,), generator=batch_gen)
        mu, var = model(x[idx])
        nll = 0.5 * (torch.log(var) + (y[idx] - mu) ** 2 / var + math.log(2 * math.pi))
        loss = nll.mean()
        opt.zero_grad()
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 100.0)
        opt.step()
        if step % 50 == 0:
            print(f"step {step:4d} nll {loss.item():8.3f} min var {var.min().item():.2e} "
                  f"max var {var.max().item():.3f} grad norm {gnorm.item():.1f}")


if __name__ == "__main__":
    main()
