# expect: {"healthy": true}
# about: held out (round late 5): trains a CLIP-style dual encoder with a learnable logit_scale = exp(param) clamped at 100; the scale and the logits grow steadily (14 to ~47) for all 1000 steps, but stay far from overflow.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Tower(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, 64), nn.GELU(), nn.Linear(64, d_out))

    def forward(self, x):
        return F.normalize(self.net(x), dim=-1)


class DualEncoder(nn.Module):
    def __init__(self, d_a, d_b, d_emb=32):
        super().__init__()
        self.tower_a = Tower(d_a, d_emb)
        self.tower_b = Tower(d_b, d_emb)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, xa, xb):
        za, zb = self.tower_a(xa), self.tower_b(xb)
        scale = self.logit_scale.exp().clamp(max=100.0)
        return scale * za @ zb.t(), scale


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=6e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    d_lat, d_a, d_b = 16, 24, 20
    proj_a = torch.randn(d_lat, d_a, generator=gen)
    proj_b = torch.randn(d_lat, d_b, generator=gen)

    model = DualEncoder(d_a, d_b)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    labels = torch.arange(args.batch_size)

    for step in range(args.steps):
        z = torch.randn(args.batch_size, d_lat, generator=gen)
        xa = z @ proj_a + 0.1 * torch.randn(args.batch_size, d_a, generator=gen)
        xb = torch.tanh(z @ proj_b) + 0.1 * torch.randn(args.batch_size, d_b, generator=gen)
        logits, scale = model(xa, xb)
        loss = 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step:4d} loss {loss.item():.4f} logit scale {scale.item():7.2f} "
                  f"max logit {logits.max().item():7.2f}")


if __name__ == "__main__":
    main()
