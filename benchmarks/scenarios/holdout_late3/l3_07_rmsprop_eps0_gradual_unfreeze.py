# expect: {"cause": "optimizer-state", "phase": "optimizer", "op": "aten.addcdiv_.default", "module": ""}
# about: held out (round late 3): a tabular MLP trained with RMSprop(eps=0) where the backbone is frozen for 60 steps and then unfrozen; first-layer weights fed by one-hot columns that never occur get exactly zero gradients, so their square_avg stays 0 and the first RMSprop update after unfreezing computes 0/0 = NaN in the optimizer step at step 60.
import argparse

import torch
import torch.nn as nn

N_NUMERIC = 12
N_REGIONS = 8


class TabularRegressor(nn.Module):
    def __init__(self, d_in=N_NUMERIC + N_REGIONS, hidden=64):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.head(self.backbone(x)).squeeze(-1)


def make_data(n=2048, seed=0):
    g = torch.Generator().manual_seed(seed)
    numeric = torch.randn(n, N_NUMERIC, generator=g)
    # only regions 0..5 occur in this training split
    region = torch.randint(0, 6, (n,), generator=g)
    onehot = torch.nn.functional.one_hot(region, N_REGIONS).float()
    region_effect = torch.linspace(-1, 1, N_REGIONS)[region]
    y = numeric[:, :4].sum(1) * 0.5 + torch.tanh(numeric[:, 4] * numeric[:, 5]) + region_effect
    y = y + 0.1 * torch.randn(n, generator=g)
    return torch.cat([numeric, onehot], dim=1), y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--unfreeze-at", type=int, default=60)
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, y = make_data()
    model = TabularRegressor()
    # pretend the backbone came pre-trained: train the head alone first
    for prm in model.backbone.parameters():
        prm.requires_grad_(False)
    opt = torch.optim.RMSprop(model.parameters(), lr=args.lr, alpha=0.99, eps=0.0)
    crit = nn.HuberLoss(delta=1.0)

    n = x.shape[0]
    for step in range(args.steps):
        if step == args.unfreeze_at:
            print(f"step {step}: unfreezing backbone")
            for prm in model.backbone.parameters():
                prm.requires_grad_(True)
        idx = torch.arange(step * args.batch, (step + 1) * args.batch) % n
        pred = model(x[idx])
        loss = crit(pred, y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            print(f"step {step:4d} loss {loss.item():.4f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
