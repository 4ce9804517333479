# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": ""}
# about: held out (round late 2): Tanh MLP regressor trained with SGD under a linear warmup (300 steps) toward a peak LR of 0.6 that is far too high; once the LR passes ~0.3 the weights oscillate and grow, and the MSE loss first overflows to inf at step 191 (lr ~0.38).
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--peak-lr", type=float, default=0.6)
parser.add_argument("--warmup", type=int, default=300)
args = parser.parse_args()

torch.manual_seed(0)

# synthetic tabular regression: 12 standardized features -> a smooth nonlinear target
N, D = 4096, 12
X = torch.randn(N, D)
w_true = torch.randn(D, 1)
y = X @ w_true + 0.5 * torch.sin(X[:, :1] * 2.0) + 0.1 * torch.randn(N, 1)


class Regressor(nn.Module):
    def __init__(self, d_in, hidden=64):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(d_in, hidden), nn.Tanh(),
            nn.Linear(hidden, hidden), nn.Tanh(),
        )
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.head(self.body(x))


model = Regressor(D)
opt = torch.optim.SGD(model.parameters(), lr=args.peak_lr)
# linear warmup from 0 to peak_lr, then constant
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup))
loss_fn = nn.MSELoss()

bs = 128
for step in range(args.steps):
    idx = torch.randint(0, N, (bs,))
    pred = model(X[idx])
    loss = loss_fn(pred, y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    if step % 20 == 0:
        print(f"step {step:4d} lr {sched.get_last_lr()[0]:.4f} loss {loss.item():.4f}")

print(f"final loss {loss.item():.4f}")
