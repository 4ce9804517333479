# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.convolution.default", "module": "features.2"}
# about: held out (round late 4): a small CNN texture classifier trained with SGD+momentum under CyclicLR(mode='exp_range') whose gamma=1.01 (meant as a decay) makes every cycle peak higher; the model trains fine for ~16 cycles until the peak lr (~2) blows it up and the first inf appears at step 342 in the output of the second convolution (features.2).
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def make_images(n, gen):
    # 3 classes of 12x12 "textures": horizontal stripes, vertical stripes, blobs
    labels = torch.randint(0, 3, (n,), generator=gen)
    coords = torch.arange(12).float()
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    freq = 0.6 + 0.4 * torch.rand(n, 1, 1, generator=gen)
    phase = 6.28 * torch.rand(n, 1, 1, generator=gen)
    horiz = torch.sin(freq * yy + phase)
    vert = torch.sin(freq * xx + phase)
    cx = 3 + 6 * torch.rand(n, 1, 1, generator=gen)
    cy = 3 + 6 * torch.rand(n, 1, 1, generator=gen)
    blob = torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / 6.0) * 2 - 0.5
    img = torch.where(labels.view(-1, 1, 1) == 0, horiz, torch.where(labels.view(-1, 1, 1) == 1, vert, blob))
    img = img + 0.3 * torch.randn(n, 12, 12, generator=gen)
    return img.unsqueeze(1), labels


class SmallConvNet(nn.Module):
    def __init__(self, n_classes=3):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Linear(32 * 3 * 3, 64), nn.ReLU(), nn.Linear(64, n_classes))

    def forward(self, x):
        h = self.features(x)
        return self.classifier(h.flatten(1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--base-lr", type=float, default=0.01)
    p.add_argument("--max-lr", type=float, default=0.08)
    # meant to be a slow decay of the cycle amplitude, but > 1 makes every cycle peak higher
    p.add_argument("--gamma", type=float, default=1.01)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x_train, y_train = make_images(4096, gen)

    model = SmallConvNet()
    opt = torch.optim.SGD(model.parameters(), lr=args.base_lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.CyclicLR(opt, base_lr=args.base_lr, max_lr=args.max_lr,
                                              step_size_up=20, mode="exp_range", gamma=args.gamma)
    perm_gen = torch.Generator().manual_seed(1)
    perm = torch.randperm(len(x_train), generator=perm_gen)
    pos = 0
    for step in range(args.steps):
        if pos + args.batch_size > len(perm):
            perm = torch.randperm(len(x_train), generator=perm_gen)
            pos = 0
        idx = perm[pos:pos + args.batch_size]
        pos += args.batch_size
        logits = model(x_train[idx])
        loss = F.cross_entropy(logits, y_train[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 20 == 0:
            acc = (logits.argmax(1) == y_train[idx]).float().mean().item()
            print(f"step {step:4d} lr {sched.get_last_lr()[0]:.4f} loss {loss.item():.4f} acc {acc:.3f}")


if __name__ == "__main__":
    main()
