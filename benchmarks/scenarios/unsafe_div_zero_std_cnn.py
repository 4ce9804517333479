# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.div.Tensor", "module": "standardize"}
# about: a CNN that standardises each image by hand, (x - mean) / std with no eps; a constant (blank) image has std 0 and gives 0/0.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


class Standardize(nn.Module):
    def forward(self, x):
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        std = x.std(dim=(1, 2, 3), keepdim=True)
        if FIXED:  # eps: a constant image has std 0
            return (x - mean) / (std + 1e-5)
        return (x - mean) / std


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.standardize = Standardize()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(16, 4)

    def forward(self, x):
        return self.classifier(self.features(self.standardize(x)).flatten(1))


images = torch.rand(400, 3, 16, 16)
labels = torch.randint(0, 4, (400,))
images[217] = 0.5  # a uniformly grey frame

model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for step in range(25):
    x, y = images[step * 16:(step + 1) * 16], labels[step * 16:(step + 1) * 16]
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
