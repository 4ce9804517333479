# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.sqrt.default", "module": ""}
# about: held out (round late 2): Diagonal Gaussian mixture fitted by Adam on sensor data where one channel is stuck at a constant; the directly-parametrized variance of that channel shrinks step by step toward 0 and goes negative, so torch.sqrt(variances) first returns NaN at step 145.
import argparse
import math

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--lr", type=float, default=5e-3)
parser.add_argument("--components", type=int, default=3)
args = parser.parse_args()

torch.manual_seed(5)

# 4 sensor channels from a machine with 3 operating modes.
# Channel 3 is a pressure sensor that is stuck and always reports the same value.
N = 6000
mode = torch.randint(0, 3, (N,))
centers = torch.tensor([[0.0, 1.0, -1.0], [2.0, -1.0, 0.5], [-2.0, 0.0, 1.5]])
X = torch.zeros(N, 4)
X[:, :3] = centers[mode] + 0.4 * torch.randn(N, 3)
X[:, 3] = 0.73


class DiagGMM(nn.Module):
    """Gaussian mixture with diagonal covariances, fitted by gradient ascent on the log-likelihood."""

    def __init__(self, k, d):
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(k))
        self.means = nn.Parameter(torch.randn(k, d))
        self.variances = nn.Parameter(torch.ones(k, d))

    def log_prob(self, x):
        std = torch.sqrt(self.variances)                      # (k, d)
        z = (x[:, None, :] - self.means) / std                # (n, k, d)
        comp = (-0.5 * z ** 2 - torch.log(std) - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_w = torch.log_softmax(self.logits, dim=0)
        return torch.logsumexp(comp + log_w, dim=1)


model = DiagGMM(args.components, 4)
opt = torch.optim.Adam(model.parameters(), lr=args.lr)

bs = 512
for step in range(args.steps):
    idx = torch.randint(0, N, (bs,))
    nll = -model.log_prob(X[idx]).mean()
    opt.zero_grad()
    nll.backward()
    opt.step()
    if step % 25 == 0:
        print(f"step {step:4d}  nll {nll.item():.4f}  min variance {model.variances.min().item():.5f}")

print(f"final loss {nll.item():.4f}")
