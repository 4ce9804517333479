# expect: {"cause": "unsafe-op", "phase": "backward", "op": "aten.div.Tensor", "module": "norm"}
# about: a hand-written LayerNorm that adds eps to sqrt(var) instead of var; an all-zero (padding) sample makes var = 0, the forward is finite but SqrtBackward divides by 0.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


class MyLayerNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        std = torch.sqrt(var + self.eps) if FIXED else torch.sqrt(var)  # fixed: eps inside the sqrt
        return self.gain * (x - mean) / (std if FIXED else std + self.eps) + self.bias


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(20, 64, bias=False)
        self.norm = MyLayerNorm(64)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.head(self.norm(self.proj(x)))


x_all = torch.randn(1024, 20)
y_all = x_all[:, :3].sum(1, keepdim=True)
x_all[700:716] = 0.0  # zero-padded rows at the end of a shard
y_all[700:716] = 0.0

model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(64):
    xb, yb = x_all[step * 16:(step + 1) * 16], y_all[step * 16:(step + 1) * 16]
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(xb), yb)
    loss.backward()
    optimizer.step()
    if step % 8 == 0:
        print(f"step {step} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
