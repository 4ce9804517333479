# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": ""}
# about: held out (round late 3): a small tanh CNN regressing blob keypoints with SGD+momentum under a triangular CyclicLR whose max_lr (1.0) is too high; it trains well during the climb and diverges near the top of the first cycle, the MSE loss first overflowing to inf in the forward pass at step 135 (lr ~0.9).
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class KeypointCNN(nn.Module):
    """Regresses the (row, col) centre of a blurry blob."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.Tanh(),
            nn.AvgPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.Tanh(),
            nn.AvgPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(16 * 4 * 4, 32), nn.Tanh(), nn.Linear(32, 2))

    def forward(self, x):
        return self.head(self.features(x))


def make_data(n=1024, seed=0):
    g = torch.Generator().manual_seed(seed)
    centre = torch.rand(n, 2, generator=g) * 12 + 2
    r = torch.arange(16).float()
    yy = r.view(1, 16, 1)
    xx = r.view(1, 1, 16)
    img = torch.exp(-((yy - centre[:, 0, None, None]) ** 2 + (xx - centre[:, 1, None, None]) ** 2) / 4.0)
    img = img + 0.1 * torch.randn(n, 16, 16, generator=g)
    target = (centre - 8) / 4  # roughly in [-1.5, 1.5]
    return img.unsqueeze(1), target


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=1.0, help="max lr of the cycle")
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    x, y = make_data()
    model = KeypointCNN()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr / 20, momentum=0.9)
    sched = torch.optim.lr_scheduler.CyclicLR(opt, base_lr=args.lr / 20, max_lr=args.lr, step_size_up=150, mode="triangular")

    n = x.shape[0]
    for step in range(args.steps):
        idx = torch.arange(step * args.batch, (step + 1) * args.batch) % n
        pred = model(x[idx])
        loss = F.mse_loss(pred, y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 25 == 0:
            print(f"step {step:4d} lr {sched.get_last_lr()[0]:.4f} loss {loss.item():.4f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
