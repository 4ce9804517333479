# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.native_batch_norm.default", "module": "features.5"}
# about: held out (cure round): 3-conv BatchNorm CNN classifier on synthetic shape images with Nesterov SGD (momentum 0.9, wd 5e-4) at lr=200 instead of a sane 0.05 (4000x); the pre-BN activations grow until the BatchNorm running_var overflows to inf around step 7, and the training loss itself turns nan only around step 45.
"""Classify synthetic 16x16 'shape' images with a small Conv-BN-ReLU network."""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"


def make_images(n, generator, size=16):
    """Four classes: horizontal bar, vertical bar, diagonal, blob; random position + noise."""
    labels = torch.randint(0, 4, (n,), generator=generator)
    yy, xx = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(), indexing="ij")
    imgs = torch.zeros(n, 1, size, size)
    cx = torch.randint(4, size - 4, (n,), generator=generator).float()
    cy = torch.randint(4, size - 4, (n,), generator=generator).float()
    for i in range(n):
        c = int(labels[i])
        if c == 0:
            m = (yy - cy[i]).abs() < 1.0
        elif c == 1:
            m = (xx - cx[i]).abs() < 1.0
        elif c == 2:
            m = ((xx - cx[i]) - (yy - cy[i])).abs() < 1.0
        else:
            m = ((xx - cx[i]) ** 2 + (yy - cy[i]) ** 2) < 9.0
        imgs[i, 0] = m.float()
    imgs = imgs + 0.3 * torch.randn(imgs.shape, generator=generator)
    return imgs, labels


class SmallCNN(nn.Module):
    def __init__(self, n_classes=4, ch=16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, ch, 3, padding=1, bias=False), nn.BatchNorm2d(ch), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(ch, 2 * ch, 3, padding=1, bias=False), nn.BatchNorm2d(2 * ch), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * ch, 2 * ch, 3, padding=1, bias=False), nn.BatchNorm2d(2 * ch), nn.ReLU(),
        )
        self.classifier = nn.Linear(2 * ch, n_classes)

    def forward(self, x):
        h = self.features(x)
        h = F.adaptive_avg_pool2d(h, 1).flatten(1)
        return self.classifier(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=0.05 if FIXED else 200.0)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2024)
    xtr, ytr = make_images(2048, g)
    xev, yev = make_images(512, g)

    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                          weight_decay=args.weight_decay, nesterov=True)

    model.eval()
    with torch.no_grad():
        print(f"initial eval loss {F.cross_entropy(model(xev), yev).item():.4f}")
    model.train()
    for step in range(args.steps):
        idx = torch.randint(0, xtr.shape[0], (args.batch,))
        logits = model(xtr[idx])
        loss = F.cross_entropy(logits, ytr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 15 == 0:
            acc = (logits.argmax(1) == ytr[idx]).float().mean().item()
            print(f"step {step} loss {loss.item():.4f} acc {acc:.3f}")

    model.eval()
    with torch.no_grad():
        logits = model(xev)
        final = F.cross_entropy(logits, yev).item()
        acc = (logits.argmax(1) == yev).float().mean().item()
    print(f"eval acc {acc:.3f}")
    print(f"final loss {final}")


if __name__ == "__main__":
    main()
