# expect: {"healthy": true}
# about: held out (round late 2): MLP regression on sensor data where every 37th batch contains glitched readings (targets off by x200); the gradient norm spikes by two to three orders of magnitude on those batches, but clipping keeps the update bounded and nothing becomes non-finite.
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--clip", type=float, default=1.0)
args = parser.parse_args()

torch.manual_seed(16)

N, D = 6000, 8
X = torch.randn(N, D)
y = torch.tanh(X[:, :3]).sum(1, keepdim=True) + 0.3 * X[:, 3:4] * X[:, 4:5] + 0.05 * torch.randn(N, 1)


class SensorMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(D, 128), nn.GELU(),
            nn.Linear(128, 128), nn.GELU(),
            nn.Linear(128, 1),
        )

    def forward(self, x):
        return self.layers(x)


model = SensorMLP()
opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-2)
loss_fn = nn.MSELoss()

bs = 64
for step in range(args.steps):
    idx = torch.randint(0, N, (bs,))
    xb, yb = X[idx], y[idx].clone()
    if step % 37 == 36:
        # logger glitch: a handful of readings come in scaled by 200
        yb[:8] *= 200.0
    loss = loss_fn(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    opt.step()
    if step % 37 == 36 or step % 25 == 0:
        print(f"step {step:4d}  loss {loss.item():12.4f}  grad-norm (pre-clip) {gnorm.item():10.2f}")

print(f"final loss {loss.item():.4f}")
