# expect: {"cause": "optimizer-state", "phase": "optimizer", "op": ["aten.addcdiv_.default", "aten._foreach_addcdiv_.ScalarList", "aten._foreach_addcdiv_.Tensor"], "module": [null, "conv1"]}
# about: a CNN on RGBA images whose alpha channel is always 0, trained with Adam(eps=0); the first conv's alpha-channel kernel gradient is exactly 0 and Adam's update there is 0/0.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.relu(self.conv2(x)).mean(dim=(2, 3))
        return self.fc(x)


rgb = torch.rand(256, 3, 16, 16)
alpha = torch.zeros(256, 1, 16, 16)  # exported PNGs: fully transparent alpha
images = torch.cat([rgb, alpha], 1)
labels = rgb.mean(dim=(2, 3)).argmax(1)

model = Net()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-8 if FIXED else 0.0)
for step in range(30):
    x, y = images[(step * 32) % 256:(step * 32) % 256 + 32], labels[(step * 32) % 256:(step * 32) % 256 + 32]
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
