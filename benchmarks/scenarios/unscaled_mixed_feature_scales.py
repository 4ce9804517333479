# expect: {"cause": "unscaled-data", "phase": "forward", "op": "aten.addmm.default", "module": "2"}
# about: tabular regression whose features keep their units (age in years, income in dollars, a ratio in [0, 1]) and whose target is in the hundreds, a Linear-LeakyReLU-Linear net with SGD(lr=1e-3, momentum=0.9): income dominates every gradient and the output layer overflows; standardising features and target trains at the same learning rate.
import argparse
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


def make_data(n: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    age = 20 + 50 * torch.rand(n, 1)
    income = 2e4 + 1.5e5 * torch.rand(n, 1)
    ratio = torch.rand(n, 1)
    x = torch.cat([age, income, ratio, torch.randint(0, 5, (n, 1)).float()], dim=1)
    y = 100 + 2 * age + income / 1000 + 50 * ratio + 5 * torch.randn(n, 1)
    return x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()

    x, y = make_data()
    if FIXED:
        x = (x - x.mean(0)) / x.std(0)
        y = (y - y.mean()) / y.std()
    model = nn.Sequential(nn.Linear(4, 32), nn.LeakyReLU(0.1), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.MSELoss()
    for step in range(args.steps):
        idx = torch.randint(0, x.shape[0], (64,))
        optimizer.zero_grad()
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        if step % 30 == 0:
            print(f"step {step} loss {loss.item():.4g}")
    with torch.no_grad():
        print(f"final loss {loss_fn(model(x), y).item():.6g}")


if __name__ == "__main__":
    main()
