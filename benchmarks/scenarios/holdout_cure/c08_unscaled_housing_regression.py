# expect: {"cause": "unscaled-data", "phase": "forward", "op": "aten.mse_loss.default", "module": ""}
# about: held out (cure round): ReLU MLP house-price regression on RAW features (sqft ~600-4000, lot ~1500-19500, year ~1900-2020, distance up to 30000 m) and raw prices in the hundreds, SGD momentum 0.9 at --learning-rate 0.2 vs a sane 0.005 on standardised data (40x, and orders of magnitude more for the raw scale); the first step sends predictions to ~1e20 and the MSE overflows to inf at step 1; the fix standardises X and y.
"""House-price regression from raw tabular features (square feet, lot size, year built, ...) with an MLP."""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"

COLUMNS = ["sqft", "lot_sqft", "year_built", "bedrooms", "bathrooms", "dist_to_city_m"]


def make_listings(n=4000, seed=42):
    """Synthetic listings in raw units; price is in thousands of dollars."""
    g = torch.Generator().manual_seed(seed)
    sqft = 600 + 3400 * torch.rand(n, generator=g)
    lot = 1500 + 18000 * torch.rand(n, generator=g)
    year = 1900 + 120 * torch.rand(n, generator=g)
    beds = torch.randint(1, 7, (n,), generator=g).float()
    baths = torch.randint(1, 4, (n,), generator=g).float()
    dist = 500 + 30000 * torch.rand(n, generator=g)
    price = (0.12 * sqft + 0.004 * lot + 0.9 * (year - 1900) + 8 * beds + 12 * baths
             - 0.004 * dist + 0.00002 * sqft * (year - 1900) / 10
             + 15 * torch.randn(n, generator=g))
    x = torch.stack([sqft, lot, year, beds, baths, dist], dim=1)
    return x, price.unsqueeze(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--learning-rate", type=float, default=0.005 if FIXED else 0.2)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--log-every", type=int, default=50)
    args = ap.parse_args()

    torch.manual_seed(0)
    x, y = make_listings()
    xtr, ytr, xte, yte = x[:3200], y[:3200], x[3200:], y[3200:]

    if FIXED:
        x_mean, x_std = xtr.mean(0), xtr.std(0)
        y_mean, y_std = ytr.mean(), ytr.std()
    else:
        x_mean, x_std = torch.zeros(x.shape[1]), torch.ones(x.shape[1])
        y_mean, y_std = torch.tensor(0.0), torch.tensor(1.0)
    xtr_n, xte_n = (xtr - x_mean) / x_std, (xte - x_mean) / x_std
    ytr_n = (ytr - y_mean) / y_std

    model = nn.Sequential(nn.Linear(len(COLUMNS), 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.learning_rate, momentum=0.9)

    def test_mse():
        with torch.no_grad():
            pred = model(xte_n) * y_std + y_mean
            return F.mse_loss(pred, yte).item()

    print(f"initial test mse {test_mse():.2f}")
    for step in range(args.steps):
        idx = torch.randint(0, xtr_n.shape[0], (args.batch,))
        loss = F.mse_loss(model(xtr_n[idx]), ytr_n[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.log_every == 0:
            print(f"step {step} train loss {loss.item():.4f}")

    print(f"final loss {test_mse()}")


if __name__ == "__main__":
    main()
