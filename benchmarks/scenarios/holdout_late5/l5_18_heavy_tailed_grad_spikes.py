# expect: {"healthy": true}
# about: held out (round late 5): trains an MLP forecaster on a sensor series with Cauchy-distributed glitches (clamped at +-2000); MSE gradient norms spike heavy-tailed to ~30 against ~0.5 typical and then come back, and clip_grad_norm_ keeps training finite.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Forecaster(nn.Module):
    def __init__(self, window, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(window, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                 nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


def sensor_series(n, window, gen):
    """Smooth signal + Cauchy-like glitches (a flaky sensor that saturates at +-2000)."""
    t = torch.arange(n + window + 1).float()
    clean = torch.sin(t / 7) + 0.5 * torch.sin(t / 23)
    u = torch.rand(t.shape, generator=gen)
    glitch = torch.tan(math.pi * (u - 0.5)).clamp(-2000.0, 2000.0)
    series = clean + 0.05 * glitch
    xs = series.unfold(0, window, 1)[: n]
    ys = series[window: window + n]
    return xs, ys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    xs, ys = sensor_series(4000, 24, gen)
    loader = DataLoader(TensorDataset(xs, ys), batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(1))

    model = Forecaster(24)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    step = 0
    for epoch in range(args.epochs):
        worst = 0.0
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            opt.step()
            worst = max(worst, gnorm.item())
            if step % 50 == 0:
                print(f"epoch {epoch} step {step:4d} loss {loss.item():10.3f} grad norm {gnorm.item():10.3f}")
            step += 1
        print(f"epoch {epoch} largest grad norm this epoch {worst:.1f}")


if __name__ == "__main__":
    main()
