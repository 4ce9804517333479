# expect: {"cause": "low-precision-overflow", "phase": "forward", "op": "aten.addmm.default", "module": "head"}
# about: held out (round late 2): House-price MLP run entirely in float16 (model.half(), Adam) with an L1 loss on prices in dollars; the predictions ramp up toward the ~$180k targets and the head's float16 output first passes 65504 (inf) at step 156.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--lr", type=float, default=5e-3)
args = parser.parse_args()

torch.manual_seed(7)

# synthetic housing data: standardized features, sale price in dollars
N, D = 5000, 14
X = torch.randn(N, D)
coef = torch.randn(D) * 25_000
price = (180_000 + X @ coef + 10_000 * torch.randn(N)).clamp(min=30_000)


class PriceNet(nn.Module):
    def __init__(self, d, hidden=128):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.head(self.backbone(x)).squeeze(-1)


# half precision everywhere to halve memory / bandwidth
model = PriceNet(D).half()
opt = torch.optim.Adam(model.parameters(), lr=args.lr, eps=1e-4)  # eps=1e-8 would underflow in fp16

bs = 64
for step in range(args.steps):
    idx = torch.randint(0, N, (bs,))
    pred = model(X[idx].half())
    loss = F.l1_loss(pred.float(), price[idx])  # mean absolute error in dollars, reduced in fp32
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 25 == 0:
        print(f"step {step:4d}  MAE ${loss.item():,.0f}  mean prediction ${pred.float().mean().item():,.0f}")

print(f"final loss {loss.item():.2f}")
