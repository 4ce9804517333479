# expect: {"cause": "unsafe-op", "phase": "backward", "op": "aten.rsqrt.default", "module": ""}
# about: held out (round late 4): a network predicting unit 3-D directions trained directly on the angular error acos(clamp(cos, -1, 1)); as the fit improves the error distribution shifts toward 0 and at step 168 one prediction rounds to cos == 1.0 exactly, where the acos backward's rsqrt(1 - x^2) returns inf (outside the model).
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class DirectionNet(nn.Module):
    """Predicts a unit 3-D direction (e.g. surface normal / gaze) from a feature vector."""

    def __init__(self, d_in, hidden=128):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.out = nn.Linear(hidden, 3)

    def forward(self, x):
        return F.normalize(self.out(self.encoder(x)), dim=-1)


def angular_error(pred, target):
    cos = (pred * target).sum(-1).clamp(-1.0, 1.0)
    return torch.acos(cos)  # radians, the metric we report


def make_directions(n, d_in, gen):
    x = torch.randn(n, d_in, generator=gen)
    a = torch.randn(d_in, 3, generator=gen) / math.sqrt(d_in)
    b = torch.randn(d_in, 3, generator=gen) / math.sqrt(d_in)
    v = torch.tanh(x @ a) * 2 + 0.5 * torch.sin(x @ b) + torch.tensor([0.0, 0.0, 1.5])
    return x, F.normalize(v, dim=-1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x, dirs = make_directions(5000, 16, gen)
    model = DirectionNet(16)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    batch_gen = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        idx = torch.randint(0, len(x), (args.batch_size,), generator=batch_gen)
        pred = model(x[idx])
        err = angular_error(pred, dirs[idx])
        loss = err.mean()  # train directly on the geodesic (angular) error
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step:4d} mean angle {math.degrees(loss.item()):.3f} deg, min {math.degrees(err.min().item()):.4f} deg")


if __name__ == "__main__":
    main()
