# expect: {"cause": "nonfinite-input", "phase": "data", "op": "input", "module": null}
# about: held out (round 4, modern stack): written by someone who had not read the code. A cell-counting CNN on synthetic 32x32 microscopy tiles served by a map-style Dataset through DataLoader(num_workers=2, shuffle=True, seeded generator), main() under if __name__ == "__main__". __getitem__ z-scores every tile on its own, (img - img.mean()) / img.std(); two of the 1200 tiles are flat background (constant 12.0), so std = 0 and the division gives 0/0 = NaN for the whole tile. That happens inside a DataLoader worker process, not in the training process: the training loop receives a batch that already holds NaN (batch 3 here), so the honest answer is bad data: cause nonfinite-input, phase data, op "input", module null. Loss prints 1.436 at step 0, then NaN (SGD spreads the NaN into every weight at step 3).
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset, DataLoader


class TileDataset(Dataset):
    """64x64 microscopy-like tiles with 0-3 bright 'cells'; label = number of cells.
    Each tile is standardised on its own (per-image z-score), as is common for microscopy."""

    def __init__(self, n, seed=0):
        self.n = n
        self.seed = seed
        g = torch.Generator().manual_seed(seed)
        self.counts = torch.randint(0, 4, (n,), generator=g)
        self.blank = set(torch.randperm(n, generator=g)[:2].tolist())   # tiles from outside the slide

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 100003 + i)
        if i in self.blank:
            img = torch.full((1, 32, 32), 12.0)            # flat background, no texture at all
        else:
            img = 12.0 + 3.0 * torch.rand(1, 32, 32, generator=g)
            yy, xx = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
            for _ in range(int(self.counts[i])):
                cy, cx = torch.randint(4, 28, (2,), generator=g).tolist()
                img[0] += 80.0 * torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 8.0)
        img = (img - img.mean()) / img.std()
        return img, self.counts[i]


class CellCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.body = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(32, 32, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        return self.head(self.body(self.stem(x)).amax(dim=(2, 3)))


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ds = TileDataset(1200)
    loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=2,
                        generator=torch.Generator().manual_seed(0), persistent_workers=False)
    model = CellCounter()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step, (x, y) in enumerate(loader):
        if step == 37:
            break
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 5 == 0:
            print(f"step {step:3d} loss {loss.item():.4f}")
    print("final loss", loss.item())


if __name__ == "__main__":
    main()
