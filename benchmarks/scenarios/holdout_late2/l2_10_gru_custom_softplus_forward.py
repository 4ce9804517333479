# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.exp.default", "module": "head.1"}
# about: held out (round late 2): GRU remaining-useful-life regressor whose positive output uses a custom autograd softplus computing log1p(exp(x)) naively; the pre-activation drifts up toward the 20-420 h targets and exp overflows to inf once it passes ~88.7, at step 277.
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--lr", type=float, default=1e-2)
args = parser.parse_args()

torch.manual_seed(10)


class Softplus(torch.autograd.Function):
    """softplus(x) = log(1 + e^x) with its derivative sigmoid(x), no threshold branch."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.log1p(torch.exp(x))

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return grad_out * torch.sigmoid(x)


class PositiveOutput(nn.Module):
    def forward(self, x):
        return Softplus.apply(x)


# run-to-failure sensor logs: 4 channels x 40 time steps; target = remaining useful life (hours)
N, T, C = 3000, 24, 4
wear = torch.rand(N, 1, 1)
t = torch.linspace(0, 1, T).view(1, T, 1)
X = torch.cat([
    wear * t * 3 + 0.1 * torch.randn(N, T, 1),
    torch.sin(8 * t + 6 * wear) + 0.1 * torch.randn(N, T, 1),
    (wear > 0.5).float() * t + 0.1 * torch.randn(N, T, 1),
    0.1 * torch.randn(N, T, 1),
], dim=2)
rul = 400.0 * (1.0 - wear.view(N)) + 20.0  # hours


class RULNet(nn.Module):
    def __init__(self, c=C, hidden=32):
        super().__init__()
        self.gru = nn.GRU(c, hidden, batch_first=True)
        self.head = nn.Sequential(nn.Linear(hidden, 1), PositiveOutput())

    def forward(self, x):
        _, h = self.gru(x)
        return self.head(h[-1]).squeeze(-1)


model = RULNet()
opt = torch.optim.Adam(model.parameters(), lr=args.lr)
loss_fn = nn.L1Loss()

bs = 64
for step in range(args.steps):
    idx = torch.randint(0, N, (bs,))
    pred = model(X[idx])
    loss = loss_fn(pred, rul[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 25 == 0:
        print(f"step {step:4d}  MAE {loss.item():.2f} h  mean predicted RUL {pred.mean().item():.1f} h")

print(f"final loss {loss.item():.4f}")
