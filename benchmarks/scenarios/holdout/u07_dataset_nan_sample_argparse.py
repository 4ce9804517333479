# expect: {"cause": "nonfinite-input", "phase": "data", "op": "input", "module": null}
# about: held out (round 2): written after the code by someone who had not read it or the suite. a CLI training script (argparse, if __name__ == "__main__") for a multi-sensor
# regressor. The Dataset builds features from a "CSV" parsed by hand; one row's humidity cell
# was "n/a" and float("nan") slipped through. DataLoader(shuffle=True, seeded generator,
# num_workers=0, batch 32) -> the NaN row (dataset index 611) lands in some batch of epoch 0;
# the model (nn.ModuleDict of per-sensor encoders) never makes the NaN: it is in the batch.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


def make_csv(n, seed):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        t, h, p = torch.rand(3, generator=g).tolist()
        hum = "n/a" if i == 611 else f"{h * 100:.2f}"
        rows.append(f"{t * 40:.3f},{hum},{900 + p * 200:.1f},{(t * 2 + h - p):.4f}")
    return rows


class SensorCSV(Dataset):
    def __init__(self, rows):
        self.x, self.y = [], []
        for r in rows:
            t, h, p, y = r.split(",")
            h = float("nan") if h == "n/a" else float(h)        # "keep it, we'll impute later"
            self.x.append(torch.tensor([float(t) / 40, h / 100, (float(p) - 900) / 200]))
            self.y.append(torch.tensor([float(y)]))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"temp": self.x[i][:1], "env": self.x[i][1:], "target": self.y[i]}


class MultiSensor(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.enc = nn.ModuleDict({"temp": nn.Linear(1, hidden), "env": nn.Linear(2, hidden)})
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, batch):
        return self.head(self.enc["temp"](batch["temp"]) + self.enc["env"](batch["env"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--hidden", type=int, default=16)
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    ds = SensorCSV(make_csv(1000, seed=7))
    loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=0,
                        generator=torch.Generator().manual_seed(3))
    model = MultiSensor(args.hidden)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        total = 0.0
        for batch in loader:
            pred = model(batch)
            loss = F.mse_loss(pred, batch["target"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
        print(f"epoch {epoch}: mean loss {total / len(loader):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
