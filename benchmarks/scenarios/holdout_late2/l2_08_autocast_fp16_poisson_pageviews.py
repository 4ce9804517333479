# expect: {"cause": "low-precision-overflow", "phase": "forward", "op": "aten.exp.default", "module": ""}
# about: held out (round late 2): Poisson page-view regressor under CPU float16 autocast whose forward returns exp(log_rate); as the log-rate learns to match counts above 65k it passes ~11.1 and the float16 exp overflows to inf at step 69.
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

torch.manual_seed(8)

# page-view counts per article: log-rate is a smooth function of 10 article features,
# heavy tailed (most articles get ~1k views, a few viral ones get >100k)
N, D = 8000, 10
X = torch.randn(N, D)
w_true = torch.randn(D) * 0.5
log_rate_true = 7.0 + X @ w_true
y = torch.poisson(torch.exp(log_rate_true))


class PoissonMLP(nn.Module):
    def __init__(self, d, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU())
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        log_rate = self.out(self.body(x)).squeeze(-1)
        return torch.exp(log_rate), log_rate


model = PoissonMLP(D)
opt = torch.optim.Adam(model.parameters(), lr=args.lr)

bs = 256
for step in range(args.steps):
    idx = torch.randint(0, N, (bs,))
    xb, yb = X[idx], y[idx]
    with torch.autocast("cpu", dtype=torch.float16):  # mixed precision to speed up the matmuls
        rate, log_rate = model(xb)
    # Poisson negative log-likelihood (up to a constant), reduced in float32
    loss = (rate.float() - yb * log_rate.float()).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 25 == 0:
        print(f"step {step:4d}  poisson nll {loss.item():.2f}  max log-rate {log_rate.max().item():.2f}")

print(f"final loss {loss.item():.4f}")
