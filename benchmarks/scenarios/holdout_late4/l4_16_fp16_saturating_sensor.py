# expect: {"healthy": true}
# about: held out (round late 4): an MLP under torch.autocast(cpu, float16) predicting photon counts through a 60000*sigmoid head, so float16 predictions sit just under 60000 (close to the 65504 limit) for most of the run but can never exceed it.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

SENSOR_MAX = 60000.0  # photon counter saturates here


class CountHead(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, 1)

    def forward(self, h):
        # bounded output: can approach but never exceed the sensor ceiling
        return SENSOR_MAX * torch.sigmoid(self.fc(h)).squeeze(-1)


class PhotonModel(nn.Module):
    def __init__(self, d_in, hidden=96):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d_in, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU())
        self.head = CountHead(hidden)

    def forward(self, x):
        return self.head(self.trunk(x))


def make_exposures(n, gen):
    x = torch.randn(n, 10, generator=gen)
    brightness = 1.2 * x[:, 0] + 0.8 * x[:, 1] - 0.4 * x[:, 2] * x[:, 3]
    counts = SENSOR_MAX * torch.sigmoid(brightness + 1.0)
    counts = (counts * (1 + 0.01 * torch.randn(n, generator=gen))).clamp(max=SENSOR_MAX)
    return x, counts


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=700)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x, y = make_exposures(16000, gen)
    model = PhotonModel(10)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    batch_gen = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        idx = torch.randint(0, len(x), (args.batch_size,), generator=batch_gen)
        with torch.autocast(device_type="cpu", dtype=torch.float16):
            pred = model(x[idx])
        loss = F.l1_loss(pred.float(), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step:4d} L1 {loss.item():9.1f} max pred {pred.max().item():8.1f} ({pred.dtype})")


if __name__ == "__main__":
    main()
