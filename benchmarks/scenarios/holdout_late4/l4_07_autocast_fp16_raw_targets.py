# expect: {"cause": "low-precision-overflow", "phase": "forward", "op": "aten.addmm.default", "module": "head"}
# about: held out (round late 4): an MLP regressing raw (unnormalised) daily visit counts up to ~470k under torch.autocast(cpu, float16); predictions grow toward the targets during training and at step 106 the fp16 output of the final Linear (head) exceeds 65504 and becomes inf, which float32 would have represented.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def make_traffic(n, gen):
    # features of a web page / day; target = raw number of daily visits (not normalised)
    feats = torch.randn(n, 20, generator=gen)
    popularity = feats[:, :5].sum(1) / 5 ** 0.5
    weekend = (torch.rand(n, generator=gen) < 2 / 7).float()
    visits = 15000 * torch.exp(0.8 * popularity) * (1 + 0.5 * weekend)
    visits = visits * (1 + 0.05 * torch.randn(n, generator=gen))
    x = torch.cat([feats, weekend[:, None]], 1)
    return x, visits[:, None]


class VisitRegressor(nn.Module):
    def __init__(self, d_in):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d_in, 128), nn.SiLU(), nn.Linear(128, 128), nn.SiLU())
        self.head = nn.Linear(128, 1)

    def forward(self, x):
        return self.head(self.trunk(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=8e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x, y = make_traffic(8192, gen)
    print(f"target range: {y.min().item():.0f} .. {y.max().item():.0f}")
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(1))

    model = VisitRegressor(x.shape[1])
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    step = 0
    for epoch in range(args.epochs):
        for xb, yb in loader:
            # mixed precision "to make CPU training faster"
            with torch.autocast(device_type="cpu", dtype=torch.float16):
                pred = model(xb)
                loss = F.l1_loss(pred.float(), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 20 == 0:
                print(f"step {step:4d} L1 {loss.item():.1f} max pred {pred.max().item():.1f}")
            step += 1


if __name__ == "__main__":
    main()
