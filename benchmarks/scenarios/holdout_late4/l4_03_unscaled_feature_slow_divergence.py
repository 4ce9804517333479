# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": ""}
# about: held out (round late 4): a linear house-price regression trained with minibatch SGD where the area columns were left unstandardised, so lr=0.0495 sits just above 2/lambda_max and the component along the top Hessian direction grows ~1.15x per step; the first inf appears at step 290 in the MSE loss (aten.mse_loss outside the model) while predictions and gradients are still finite.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def make_housing(n, gen):
    # columns: rooms, age (decades), distance (km), area (100 m^2, NOT standardised), area^2
    rooms = torch.randint(1, 7, (n, 1), generator=gen).float()
    age = 5 * torch.rand(n, 1, generator=gen)
    dist = 20 * torch.rand(n, 1, generator=gen).sqrt()
    area = 0.4 + 0.35 * rooms + 0.2 * torch.randn(n, 1, generator=gen).abs()
    x = torch.cat([rooms, age, dist, area, area ** 2], dim=1)
    price = 1.2 * area + 0.3 * rooms - 0.05 * dist - 0.1 * age + 0.1 * torch.randn(n, 1, generator=gen)
    return x, price


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.0495)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x, y = make_housing(4096, gen)
    # standardise only the "small" columns; the area columns were left raw by mistake
    x[:, :3] = (x[:, :3] - x[:, :3].mean(0)) / x[:, :3].std(0)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(1))

    model = nn.Linear(5, 1)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    step = 0
    for epoch in range(args.epochs):
        total = 0.0
        for xb, yb in loader:
            pred = model(xb)
            loss = F.mse_loss(pred, yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
            step += 1
        if epoch % 5 == 0:
            print(f"epoch {epoch:3d} step {step:4d} mean loss {total / len(loader):.4g}")


if __name__ == "__main__":
    main()
