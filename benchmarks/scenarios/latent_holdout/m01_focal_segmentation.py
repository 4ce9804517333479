"""Per-timestep event segmentation of synthetic two-channel sensor traces with a small
dilated 1-D conv net, trained with a hand-written class-weighted focal loss (mostly background).
Latent hazard (line 21): FocalLoss.forward applies torch.log(pt) to a softmax probability with no
clamp; pt only underflows to 0 once a logit gap exceeds ~100, which these small logits never reach."""
import argparse

import torch
import torch.nn as nn


class FocalLoss(nn.Module):
    def __init__(self, gamma=2.0, class_weights=None):
        super().__init__()
        self.gamma = gamma
        self.register_buffer("class_weights", class_weights)

    def forward(self, logits, target):
        # logits: (N, C, T), target: (N, T)
        probs = torch.softmax(logits, dim=1)
        pt = probs.gather(1, target.unsqueeze(1)).squeeze(1)
        focal = -((1.0 - pt) ** self.gamma) * torch.log(pt)
        w = self.class_weights[target]
        return (w * focal).sum() / w.sum()


class EventSegmenter(nn.Module):
    def __init__(self, in_ch=2, hidden=32, n_classes=3):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv1d(in_ch, hidden, kernel_size=7, padding=3),
            nn.GELU(),
            nn.Conv1d(hidden, hidden, kernel_size=5, padding=4, dilation=2),
            nn.GELU(),
        )
        self.head = nn.Conv1d(hidden, n_classes, kernel_size=1)

    def forward(self, x):
        return self.head(self.body(x))


def make_dataset(n, length, gen):
    x = 0.3 * torch.randn(n, 2, length, generator=gen)
    y = torch.zeros(n, length, dtype=torch.long)
    bump = torch.hann_window(12, periodic=False)
    starts = torch.randint(0, length - 12, (n, 2), generator=gen)
    kinds = torch.randint(1, 3, (n, 2), generator=gen)
    for i in range(n):
        for j in range(2):
            s, k = int(starts[i, j]), int(kinds[i, j])
            x[i, k - 1, s:s + 12] += 1.5 * bump
            y[i, s:s + 12] = k
    return x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x_all, y_all = make_dataset(256, 96, gen)

    model = EventSegmenter()
    criterion = FocalLoss(gamma=2.0, class_weights=torch.tensor([0.25, 1.0, 1.0]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)

    for step in range(args.steps):
        idx = torch.randint(0, x_all.shape[0], (32,), generator=gen)
        logits = model(x_all[idx])
        loss = criterion(logits, y_all[idx])

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step:4d}  focal {loss.item():.5f}")
    print(f"final focal {loss.item():.5f}")


if __name__ == "__main__":
    main()
