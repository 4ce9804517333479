# expect: {"cause": "low-precision-overflow", "phase": "forward", "op": "aten.sum.default", "module": null}
# about: a half-precision convolutional denoiser trained with a hand-written sum-of-squared-errors loss and progressive resizing; at 128x128 the sum over the batch exceeds float16's 65504 although every term is small.
import os

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

model = nn.Sequential(
    nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(),
    nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
    nn.Conv2d(8, 1, 3, padding=1),
)
if FIXED:  # fixed: float32 weights, and a mean loss whose scale does not grow with the image size
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
else:
    model = model.half()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-5, momentum=0.9)

clean = torch.rand(64, 1, 16, 16)
for step in range(30):
    size = 32 if step < 12 else 128  # progressive resizing
    target = F.interpolate(clean[(step * 16) % 64:(step * 16) % 64 + 16], size=size, mode="bilinear")
    noisy = target + 0.3 * torch.randn_like(target)
    optimizer.zero_grad()
    if FIXED:
        loss = F.mse_loss(model(noisy), target)
    else:
        pred = model(noisy.half())
        loss = ((pred - target.half()) ** 2).sum()
    loss.backward()
    optimizer.step()
    if step % 4 == 0:
        print(f"step {step} size {size} loss {loss.item():.1f}")
print(f"final loss {loss.item():.6g}")
