# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.addmm.default", "module": "mlp.2"}
# about: held out (round late 5): trains an embedding+MLP price regressor with SGD momentum and 4-micro-batch gradient accumulation, but each micro-batch loss is multiplied by accum_steps instead of divided (16x the intended step); it slowly diverges and the first Inf appears at optimizer step 26 (steps count iterations of 4 backward passes) in the forward addmm of mlp.2.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class PriceRegressor(nn.Module):
    def __init__(self, n_num, n_cat, emb_dim=8, hidden=64):
        super().__init__()
        self.cat_emb = nn.Embedding(n_cat, emb_dim)
        self.mlp = nn.Sequential(
            nn.Linear(n_num + emb_dim, hidden), nn.SiLU(),
            nn.Linear(hidden, hidden), nn.SiLU(),
        )
        self.out = nn.Linear(hidden, 1)

    def forward(self, x_num, x_cat):
        h = torch.cat([x_num, self.cat_emb(x_cat)], dim=1)
        return self.out(self.mlp(h)).squeeze(1)


def make_dataset(n, n_num, n_cat, gen):
    x_num = torch.randn(n, n_num, generator=gen)
    x_cat = torch.randint(0, n_cat, (n,), generator=gen)
    w = torch.randn(n_num, generator=gen)
    cat_effect = torch.randn(n_cat, generator=gen)
    y = x_num @ w + 0.5 * torch.sin(3 * x_num[:, 0]) + cat_effect[x_cat] + 0.1 * torch.randn(n, generator=gen)
    return TensorDataset(x_num, x_cat, y)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--accum-steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.008)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    ds = make_dataset(4096, 12, 20, gen)
    loader = DataLoader(ds, batch_size=args.micro_batch, shuffle=True,
                        generator=torch.Generator().manual_seed(1))

    model = PriceRegressor(12, 20)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    opt_step = 0
    for epoch in range(args.epochs):
        opt.zero_grad()
        for i, (xn, xc, y) in enumerate(loader):
            pred = model(xn, xc)
            loss = F.mse_loss(pred, y)
            # scale the micro-batch loss for gradient accumulation
            (loss * args.accum_steps).backward()
            if (i + 1) % args.accum_steps == 0:
                opt.step()
                opt.zero_grad()
                if opt_step % 10 == 0:
                    print(f"epoch {epoch} opt step {opt_step:4d} loss {loss.item():.4f}")
                opt_step += 1


if __name__ == "__main__":
    main()
