# expect: {"healthy": true}
# about: held out (round late 5): trains a per-cell crowd-density model under float16 autocast whose scene count is a float16 sum of 600 cells each bounded by 100; predicted counts climb to ~54k, close to the float16 max 65504, but cannot exceed 60000 and the loss is taken in float32 on counts in thousands.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class CellDensity(nn.Module):
    """Per-cell density in [0, max_per_cell], summed into a scene count."""

    def __init__(self, d_in, hidden=32, max_per_cell=100.0):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.max_per_cell = max_per_cell

    def forward(self, cells):                      # (B, n_cells, d_in)
        density = self.max_per_cell * torch.sigmoid(self.mlp(cells).squeeze(-1))
        return density.sum(1), density


def scenes(n, n_cells, d_in, gen):
    """Stadium-camera scenes: cell features ~ occupancy cues; most scenes are packed."""
    occ = torch.rand(n, 1, generator=gen) ** 0.3                     # skewed to full stadiums
    cell_occ = (occ + 0.05 * torch.randn(n, n_cells, generator=gen)).clamp(0, 1)
    mix = torch.randn(1, d_in, generator=gen)
    feats = cell_occ[..., None] * mix + 0.1 * torch.randn(n, n_cells, d_in, generator=gen)
    counts = (97.0 * cell_occ).sum(1)
    return feats, counts


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    n_cells, d_in = 600, 6
    feats, counts = scenes(1024, n_cells, d_in, gen)

    model = CellDensity(d_in)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    for step in range(args.steps):
        idx = torch.randint(0, feats.shape[0], (args.batch_size,), generator=gen)
        x, y = feats[idx], counts[idx]
        with torch.autocast(device_type="cpu", dtype=torch.float16):
            pred, _density = model(x)
        loss = F.mse_loss(pred.float() / 1000.0, y / 1000.0)     # counts in thousands
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step:4d} loss {loss.item():.4f} max predicted count {pred.max().item():8.1f} "
                  f"(target max {y.max().item():8.1f}) dtype {pred.dtype}")


if __name__ == "__main__":
    main()
