# expect: {"cause": "bad-initialization", "phase": "forward", "op": "aten.convolution.default", "module": "features.28"}
# about: a DCGAN-style weights_init where Conv2d ended up in the BatchNorm branch, so every conv kernel gets N(1, 0.02); all-positive kernels multiply the scale by ~fan_in per layer and a conv overflows at the first step.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


def weights_init(m):
    classname = m.__class__.__name__
    if FIXED and "Conv2d" in classname:  # fixed: He init for the ReLU convolutions
        nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
        nn.init.zeros_(m.bias)
    elif "Norm" in classname or "Conv2d" in classname:  # copied from the BatchNorm branch by mistake
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)
    elif classname.find("Linear") != -1:
        nn.init.normal_(m.weight, 0.0, 0.02)


def block(cin, cout):
    return [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU()]


layers = block(3, 64)
for _ in range(15):
    layers += block(64, 64)
model = nn.Sequential()
model.features = nn.Sequential(*layers)
model.pool = nn.AdaptiveAvgPool2d(1)
model.flatten = nn.Flatten()
model.fc = nn.Linear(64, 5)
model.apply(weights_init)

images = torch.rand(128, 3, 8, 8)
labels = torch.randint(0, 5, (128,))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
for step in range(30):
    x, y = images[(step * 16) % 128:(step * 16) % 128 + 16], labels[(step * 16) % 128:(step * 16) % 128 + 16]
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4g}")
print(f"final loss {loss.item():.6g}")
