# expect: {"cause": "low-precision-overflow", "phase": "backward", "op": "aten.mm.default", "module": "head", "grad_fn": "AddmmBackward0"}
# about: held out (round 2): written after the code by someone who had not read it or the suite. house-price regression in dollars (targets ~1e5..1e6, not rescaled) under
# torch.autocast("cpu", dtype=torch.float16) "to go faster", no GradScaler (it's CPU...). The
# linear layers run in float16, the MSE in float32. Predicted: the float16 weight gradient of
# the last Linear (grad_output ~ (pred - y) ~ 1e5..1e6 times hidden activations, summed
# over the batch) overflows 65504 in the first backward; in float32 it would be finite.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)

N = 1024
X = torch.randn(N, 10)
price = 3.0e5 + 1.0e5 * (X[:, 0] + 0.5 * X[:, 1]) + 2.0e4 * torch.randn(N)
price = price.clamp(min=5e4).unsqueeze(1)


class PriceNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU())
        self.head = nn.Linear(64, 1)

    def forward(self, x):
        return self.head(self.body(x))


model = PriceNet()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(60):
    i = torch.arange(step * 64, step * 64 + 64) % N
    with torch.autocast("cpu", dtype=torch.float16):
        pred = model(X[i])
        loss = F.mse_loss(pred.float(), price[i])
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step:2d} rmse ${loss.sqrt().item():,.0f}")
