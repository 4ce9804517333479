# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.rsqrt.default", "module": "block2.norm"}
# about: held out (round late 4): an MLP classifier with hand-rolled batch standardisation (rsqrt of the batch variance, no eps) after ReLU and an L1 activity penalty that slowly kills hidden units; when a unit of block2 becomes zero for the whole batch its variance is exactly 0 and rsqrt returns inf at step 119 in block2.norm.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class BatchStandardize(nn.Module):
    """Hand-rolled batch standardisation (no running stats, no eps: 'the batch is big enough')."""

    def __init__(self, dim):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(dim))
        self.shift = nn.Parameter(torch.zeros(dim))

    def forward(self, h):
        mu = h.mean(dim=0, keepdim=True)
        var = ((h - mu) ** 2).mean(dim=0, keepdim=True)
        return (h - mu) * torch.rsqrt(var) * self.gain + self.shift


class SparseBlock(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.fc = nn.Linear(d_in, d_out)
        self.norm = BatchStandardize(d_out)

    def forward(self, x):
        a = F.relu(self.fc(x))
        self.last_activity = a.abs().mean()
        return self.norm(a)


class SparseCoderNet(nn.Module):
    def __init__(self, d_in, hidden, n_out):
        super().__init__()
        self.block1 = SparseBlock(d_in, hidden)
        self.block2 = SparseBlock(hidden, hidden)
        self.out = nn.Linear(hidden, n_out)

    def forward(self, x):
        return self.out(self.block2(self.block1(x)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--sparsity", type=float, default=1.0)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    n, d = 6000, 40
    x = torch.randn(n, d, generator=gen)
    proj = torch.randn(d, 5, generator=gen)
    y = (x @ proj).argmax(1)

    model = SparseCoderNet(d, 128, 5)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    order_gen = torch.Generator().manual_seed(2)
    for step in range(args.steps):
        idx = torch.randint(0, n, (args.batch_size,), generator=order_gen)
        logits = model(x[idx])
        ce = F.cross_entropy(logits, y[idx])
        # L1 activity penalty to get sparse hidden codes
        reg = model.block1.last_activity + model.block2.last_activity
        loss = ce + args.sparsity * reg
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step:4d} ce {ce.item():.4f} activity {reg.item():.4f}")


if __name__ == "__main__":
    main()
