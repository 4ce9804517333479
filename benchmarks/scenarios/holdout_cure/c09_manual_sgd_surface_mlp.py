# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.pow.Tensor_Scalar", "module": ""}
# about: held out (cure round): 3-layer ReLU MLP surface regression trained with a hand-written SGD update (p -= lr * p.grad under no_grad, no torch.optim) at lr=2.0 instead of a sane 0.05 (40x); the loss grows by orders of magnitude each step, the predictions reach ~1e37 and the squared error overflows to inf at step 5, nan from step 6.
"""From-scratch training loop: a 2-hidden-layer MLP fit to a 2-D surface with a hand-written SGD update."""
import argparse
import os

import torch
import torch.nn as nn

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"


def make_surface(n, generator):
    xy = 4 * torch.rand(n, 2, generator=generator) - 2
    z = torch.sin(2 * xy[:, 0]) * torch.cos(1.5 * xy[:, 1]) + 0.25 * (xy ** 2).sum(1)
    return xy, z.unsqueeze(1) + 0.05 * torch.randn(n, 1, generator=generator)


class SurfaceNet(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.fc1 = nn.Linear(2, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, 1)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = torch.relu(self.fc2(h))
        return self.fc3(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=0.05 if FIXED else 2.0)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--log-every", type=int, default=100)
    args = ap.parse_args()

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(8)
    xtr, ytr = make_surface(4096, g)
    xev, yev = make_surface(1024, g)
    model = SurfaceNet()

    with torch.no_grad():
        print(f"initial eval mse {((model(xev) - yev) ** 2).mean().item():.4f}")
    for step in range(args.steps):
        idx = torch.randint(0, xtr.shape[0], (args.batch,))
        pred = model(xtr[idx])
        loss = ((pred - ytr[idx]) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= args.lr * p.grad
                p.grad.zero_()
        if step % args.log_every == 0:
            print(f"step {step} loss {loss.item():.5f}")

    with torch.no_grad():
        final = ((model(xev) - yev) ** 2).mean().item()
    print(f"final loss {final}")


if __name__ == "__main__":
    main()
