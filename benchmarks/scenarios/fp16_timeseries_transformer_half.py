# expect: {"cause": "low-precision-overflow", "phase": "forward", "op": ["aten.bmm.default", "aten.mm.default"], "module": "encoder.attn"}
# about: a small time-series Transformer converted with model.half() and fed raw prices that rise from 100 to ~1300; the attention scores q.k/sqrt(d) exceed float16's 65504 (fine in float32) and softmax turns the inf into NaN.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

D, H, T = 32, 4, 16


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.out = nn.Linear(D, D)

    def forward(self, x):
        B = x.shape[0]
        q = self.q(x).view(B, T, H, D // H).transpose(1, 2)
        k = self.k(x).view(B, T, H, D // H).transpose(1, 2)
        v = self.v(x).view(B, T, H, D // H).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / (D // H) ** 0.5
        att = torch.softmax(scores, dim=-1)
        return self.out((att @ v).transpose(1, 2).reshape(B, T, D))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = SelfAttention()
        self.ff = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, D))

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.ff(x)


class Forecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(3, D)
        self.encoder = Encoder()
        self.head = nn.Linear(D, 1)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x))[:, -1])


# open / high / low prices of a rising random walk (100 -> ~1300), not normalised
walk = 100 + torch.cumsum(0.4 + 0.3 * torch.randn(3000), 0)
series = torch.stack([walk, walk + 2 * torch.rand(3000), walk - 2 * torch.rand(3000)], 1)
model = Forecaster()
if FIXED:  # fixed: float32, and prices taken relative to the window's last close (so a normal learning rate)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
else:
    model = model.half()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-7)
for step in range(40):
    starts = step * 70 + torch.arange(16) * 4  # walk forward in time
    x = torch.stack([series[s:s + T] for s in starts])
    y = torch.stack([series[s + T, :1] for s in starts]) - x[:, -1, :1]
    optimizer.zero_grad()
    if FIXED:
        loss = nn.functional.mse_loss(model(x - x[:, -1:, :1]), y)
    else:
        loss = nn.functional.mse_loss(model(x.half()).float(), y)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
