# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.div.Tensor", "module": "norm2"}
# about: held out (round late 5): trains an MLP classifier with hand-rolled batch standardisation (h - mean) / std without eps plus an L1 activity penalty that gradually kills ReLU units; at step 133 one unit feeding norm2 is dead for the whole batch, its std is 0 and the division in norm2 gives 0/0 = NaN.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class BatchStandardize(nn.Module):
    """Hand-rolled batch standardisation (no running stats, no eps)."""

    def __init__(self, dim):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(dim))
        self.shift = nn.Parameter(torch.zeros(dim))

    def forward(self, h):
        mu = h.mean(0, keepdim=True)
        sd = h.std(0, keepdim=True)
        return self.gain * (h - mu) / sd + self.shift


class SparseFeatureNet(nn.Module):
    """MLP whose hidden ReLU features are L1-penalised so they stay interpretable."""

    def __init__(self, d_in, d_hidden, n_out):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.norm1 = BatchStandardize(d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.norm2 = BatchStandardize(d_hidden)
        self.head = nn.Linear(d_hidden, n_out)

    def forward(self, x):
        a1 = F.relu(self.fc1(x))
        h = self.norm1(a1)
        a2 = F.relu(self.fc2(h))
        h = self.norm2(a2)
        return self.head(h), (a1, a2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--l1", type=float, default=0.5)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)

    d_in, n_cls = 20, 5
    proto = torch.randn(n_cls, d_in, generator=gen)
    model = SparseFeatureNet(d_in, 48, n_cls)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    for step in range(args.steps):
        y = torch.randint(0, n_cls, (args.batch_size,), generator=gen)
        x = proto[y] + 0.8 * torch.randn(args.batch_size, d_in, generator=gen)
        logits, acts = model(x)
        ce = F.cross_entropy(logits, y)
        sparsity = sum(a.abs().mean() for a in acts)
        loss = ce + args.l1 * sparsity
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            active = [(a > 0).float().mean().item() for a in acts]
            print(f"step {step:4d} ce {ce.item():.4f} l1 {sparsity.item():.4f} "
                  f"active {active[0]:.3f}/{active[1]:.3f}")


if __name__ == "__main__":
    main()
