# expect: {"cause": "unscaled-data", "phase": "forward", "op": "aten.addmm.default", "module": "2"}
# about: house prices in dollars (3e5 ± 1e5) as raw regression targets for a ReLU MLP with SGD(momentum=0.9, lr=0.01): the MSE is 1e11 before any update, every gradient is huge, and the output layer overflows within a few steps; standardising the targets trains at the same learning rate.
import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    x = torch.randn(2048, 8)
    price = 3e5 + 1e5 * torch.tanh(x @ torch.randn(8, 1)) + 5e3 * torch.randn(2048, 1)
    y = (price - price.mean()) / price.std() if FIXED else price
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for step in range(args.steps):
        idx = torch.randint(0, 2048, (64,))
        optimizer.zero_grad()
        loss = F.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.4g}")
    with torch.no_grad():
        print(f"final loss {F.mse_loss(model(x), y).item():.6g}")


if __name__ == "__main__":
    main()
