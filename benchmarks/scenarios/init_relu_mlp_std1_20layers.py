# expect: {"cause": "bad-initialization", "phase": "forward", "op": "aten.mse_loss.default", "module": null}
# about: a 20-layer ReLU MLP initialised with nn.init.normal_(w, 0, 1) instead of Kaiming; each layer multiplies the activation scale by ~sqrt(fan_in/2) so the output is ~1e22 at the first step and the squared error overflows.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


class DeepMLP(nn.Module):
    def __init__(self, d_in=32, width=256, depth=20):
        super().__init__()
        layers = []
        for i in range(depth):
            layers += [nn.Linear(d_in if i == 0 else width, width), nn.ReLU()]
        self.net = nn.Sequential(*layers)
        self.out = nn.Linear(width, 1)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                if FIXED:  # He init: keeps the activation scale through 20 ReLU layers
                    nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                else:
                    nn.init.normal_(m.weight, 0, 1)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.out(self.net(x))


model = DeepMLP()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
x_all = torch.randn(512, 32)
y_all = x_all[:, :4].sum(1, keepdim=True)
for step in range(40):
    idx = torch.arange(step * 32, step * 32 + 32) % 512
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x_all[idx]), y_all[idx])
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4g}")
print(f"final loss {loss.item():.6g}")
