# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.mean.default", "module": ""}
# about: held out (round late 5): trains a small CNN on synthetic oriented-bar patches with online hard example mining (loss = ce[ce > 0.02].mean(), outside the model); as the model improves the hard set per batch shrinks and at step 347 it is empty, so the mean over zero elements gives NaN.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class PatchCNN(nn.Module):
    def __init__(self, n_cls=4):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.classifier = nn.Linear(16 * 4, n_cls)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


def bar_images(n, size, gen):
    """Oriented-bar patches: horizontal, vertical, diagonal, anti-diagonal."""
    y = torch.randint(0, 4, (n,), generator=gen)
    img = 0.3 * torch.randn(n, 1, size, size, generator=gen)
    pos = torch.randint(1, size - 1, (n,), generator=gen)
    r = torch.arange(size)
    for i in range(n):
        c = int(pos[i])
        k = int(y[i])
        if k == 0:
            img[i, 0, c, :] += 1.0
        elif k == 1:
            img[i, 0, :, c] += 1.0
        elif k == 2:
            img[i, 0, r, r] += 1.0
        else:
            img[i, 0, r, size - 1 - r] += 1.0
    return img, y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--hard-thresh", type=float, default=0.02)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x_all, y_all = bar_images(4096, 10, gen)

    model = PatchCNN()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    for step in range(args.steps):
        idx = torch.randint(0, x_all.shape[0], (args.batch_size,), generator=gen)
        x, y = x_all[idx], y_all[idx]
        ce = F.cross_entropy(model(x), y, reduction="none")
        # online hard example mining: only back-propagate the examples we still get wrong-ish
        hard = ce[ce > args.hard_thresh]
        loss = hard.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step:4d} mean ce {ce.mean().item():.4f} hard {hard.numel():3d} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
