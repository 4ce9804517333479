# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.log.default", "module": null}
# about: binary cross-entropy written by hand as log(sigmoid(z)); the sigmoid saturates to exactly 1.0 and log(1 - p) = log(0).
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

# two well separated blobs: the classifier quickly becomes very confident
n = 512
x = torch.cat([torch.randn(n // 2, 10) + 4.0, torch.randn(n // 2, 10) - 4.0])
y = torch.cat([torch.ones(n // 2, 1), torch.zeros(n // 2, 1)])

model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)

for step in range(60):
    idx = torch.randint(0, n, (64,))
    xb, yb = x[idx], y[idx]
    optimizer.zero_grad()
    if FIXED:  # BCEWithLogitsLoss: the log-sigmoid on the logits, never log(0)
        loss = nn.functional.binary_cross_entropy_with_logits(model(xb), yb)
    else:
        p = torch.sigmoid(model(xb))
        loss = -(yb * torch.log(p) + (1 - yb) * torch.log(1 - p)).mean()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
