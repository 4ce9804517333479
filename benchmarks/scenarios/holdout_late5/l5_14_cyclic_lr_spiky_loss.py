# expect: {"healthy": true}
# about: held out (round late 5): trains a LayerNorm residual MLP with SGD momentum and a triangular cyclic LR peaking at 0.45; at the first LR peaks the loss spikes ~1000x (to ~400) and gradient norms to ~600 before settling, but LayerNorm and gradient clipping keep it finite.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class ResMLP(nn.Module):
    def __init__(self, d_in, width, depth, d_out):
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
                                     for _ in range(depth)])
        self.out = nn.Linear(width, d_out)

    def forward(self, x):
        h = self.inp(x)
        for blk in self.blocks:
            h = h + blk(h)
        return self.out(h)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=900)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--base-lr", type=float, default=1e-3)
    p.add_argument("--max-lr", type=float, default=0.45)
    p.add_argument("--half-cycle", type=int, default=75)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    d_in = 16
    w1 = torch.randn(d_in, 32, generator=gen)
    w2 = torch.randn(32, 1, generator=gen) / 6

    def batch(n):
        x = torch.randn(n, d_in, generator=gen)
        y = torch.tanh(x @ w1) @ w2 + 0.05 * torch.randn(n, 1, generator=gen)
        return x, y

    model = ResMLP(d_in, 64, 3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=args.base_lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.CyclicLR(opt, base_lr=args.base_lr, max_lr=args.max_lr,
                                              step_size_up=args.half_cycle, mode="triangular")

    for step in range(args.steps):
        x, y = batch(args.batch_size)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()
        sched.step()
        if step % 25 == 0:
            print(f"step {step:4d} lr {sched.get_last_lr()[0]:.4f} loss {loss.item():.4f} grad norm {gnorm.item():.2f}")


if __name__ == "__main__":
    main()
