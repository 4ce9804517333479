# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": ["aten.convolution.default", "aten.conv2d.default"], "module": "features.3"}
# about: held out (lr round): small CNN classifying synthetic stripe/square images with plain SGD + weight decay and nn.CrossEntropyLoss at lr=500 instead of a sane 0.05 (10^4x), the second conv overflows to inf at step 4.
"""Classify synthetic 16x16 stripe/cross images with a small CNN, plain SGD + weight decay."""
import os

import torch
import torch.nn as nn

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"

LR = 0.05 if FIXED else 500.0   # config copied from a "fast convergence" sweep
WEIGHT_DECAY = 5e-4
STEPS = 200
BATCH = 32
SIZE = 16


def synth_batch(n):
    """Four classes: horizontal bar, vertical bar, diagonal, and a centred square."""
    labels = torch.randint(0, 4, (n,))
    imgs = 0.3 * torch.randn(n, 1, SIZE, SIZE)
    for i, c in enumerate(labels.tolist()):
        p = int(torch.randint(2, SIZE - 3, (1,)))
        if c == 0:
            imgs[i, 0, p:p + 2, :] += 1.0
        elif c == 1:
            imgs[i, 0, :, p:p + 2] += 1.0
        elif c == 2:
            r = torch.arange(SIZE)
            imgs[i, 0, r, (r + p) % SIZE] += 1.0
        else:
            imgs[i, 0, 5:11, 5:11] += 0.8
    return imgs, labels


class SmallCNN(nn.Module):
    def __init__(self, n_classes=4):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.head = nn.Linear(16 * 4 * 4, n_classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def main():
    torch.manual_seed(0)
    model = SmallCNN()
    criterion = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    for step in range(STEPS):
        x, y = synth_batch(BATCH)
        logits = model(x)
        loss = criterion(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            acc = (logits.argmax(1) == y).float().mean().item()
            print(f"step {step} loss {loss.item():.4f} acc {acc:.2f}")
    torch.manual_seed(123)
    x, y = synth_batch(256)
    with torch.no_grad():
        final = criterion(model(x), y).item()
    print(f"final loss {final}")


if __name__ == "__main__":
    main()
