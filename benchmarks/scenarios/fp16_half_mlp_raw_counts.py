# expect: {"cause": "low-precision-overflow", "phase": "forward", "op": "aten.addmm.default", "module": "0"}
# about: an MLP converted with model.half() and fed raw, unnormalised sensor counts (up to ~60000); the first Linear's output exceeds float16's maximum 65504.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

counts = torch.randint(0, 60000, (1024, 12)).float()
label = (counts[:, 0] > counts[:, 1]).long()

model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 2))
if not FIXED:  # fixed: keep the model in float32
    model = model.half()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
for step in range(40):
    idx = torch.arange(step * 32, step * 32 + 32) % 1024
    x = counts[idx] if FIXED else counts[idx].half()
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x).float(), label[idx])
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
