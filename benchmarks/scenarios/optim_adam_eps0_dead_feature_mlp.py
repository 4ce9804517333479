# expect: {"cause": "optimizer-state", "phase": "optimizer", "op": ["aten.addcdiv_.default", "aten._foreach_addcdiv_.ScalarList", "aten._foreach_addcdiv_.Tensor"], "module": [null, "0"]}
# about: Adam(eps=0) on an MLP whose one-hot input has a category that never occurs; that input column's weight gradient is exactly 0, and Adam's update there is 0 / sqrt(0) = NaN.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

n, n_cat = 2048, 6
category = torch.randint(0, n_cat - 1, (n,))  # the last category ("other") is never present
numeric = torch.randn(n, 4)
x_all = torch.cat([nn.functional.one_hot(category, n_cat).float(), numeric], 1)
y_all = (numeric[:, :1] + category[:, None].float() * 0.5)

model = nn.Sequential(nn.Linear(n_cat + 4, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-8 if FIXED else 0.0)  # "eps only adds bias"
for step in range(40):
    idx = torch.randint(0, n, (64,))
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x_all[idx]), y_all[idx])
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
