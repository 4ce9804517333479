# expect: {"cause": "unscaled-data", "phase": "forward", "op": "aten.mse_loss.default", "module": null}
# guess before tracer: weights grow geometrically (momentum 0.99 + lr 0.5 on targets ~1e5); first overflow in the squared error (aten.mse_loss.default, module null) or in the backward of it, after a handful of steps; reftrace: aten.mse_loss.default at step 2, module null (pred reached 4.9e30). Borderline: only 2 updates, the first gradient is already ~1e5-scale because of the raw targets, so "exploding-gradients" is a defensible reading too; what distinguishes: update/weight ratio >>1 at step 0 and weight norm growth (lr) vs gradient norm growing with weights near init (explode)
# about: held out (round 3): written after the code by someone who had not read it or the suite. house-price regression on standardised features but raw targets (prices ~1e5), a 2-layer ReLU MLP trained with SGD(lr=0.5, momentum=0.99) copied from a classification recipe; each step overshoots and momentum amplifies it.
import torch
from torch import nn

torch.manual_seed(6)
torch.set_num_threads(1)

X = torch.randn(2000, 12)
price = 2e5 + 5e4 * (X[:, :4] @ torch.tensor([1.0, -0.5, 0.3, 0.8])) + 1e4 * torch.randn(2000)
model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.99)
for step in range(100):
    idx = torch.arange(step * 64, step * 64 + 64) % 2000
    opt.zero_grad()
    pred = model(X[idx]).squeeze(1)
    loss = nn.functional.mse_loss(pred, price[idx])
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4g}")
