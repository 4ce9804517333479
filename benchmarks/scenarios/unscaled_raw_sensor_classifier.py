# expect: {"cause": "unscaled-data", "phase": "forward", "op": "aten.addmm.default", "module": "net.4"}
# about: raw sensor readings (around 3000 ± 800 counts, never normalised) into a LeakyReLU classifier trained with SGD(lr=0.1) and cross-entropy: the first layer's outputs are in the thousands, the updates scale with them, and the output Linear overflows within a few steps; standardising each feature trains at the same learning rate.
import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.LeakyReLU(0.1), nn.Linear(64, 64), nn.LeakyReLU(0.1), nn.Linear(64, 4))

    def forward(self, x):
        return self.net(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    signal = torch.randn(4096, 16)
    labels = (signal[:, :4].sum(1) > 0).long() + 2 * (signal[:, 4:8].sum(1) > 0).long()
    readings = 3000.0 + 800.0 * signal  # ADC counts as the sensor reports them
    if FIXED:
        readings = (readings - readings.mean(0)) / readings.std(0)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        idx = torch.randint(0, 4096, (128,))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(readings[idx]), labels[idx])
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.4g}")
    with torch.no_grad():
        print(f"final loss {F.cross_entropy(model(readings), labels).item():.6g}")


if __name__ == "__main__":
    main()
