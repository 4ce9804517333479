# expect: {"cause": "nonfinite-parameters", "phase": "forward", "op": "parameter", "module": "features.3"}
# about: fine-tuning a "pretrained" CNN whose checkpoint holds a NaN in one conv bias; the classifier head is replaced and trained on new data.
import io
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


def make_backbone():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    )


class Net(nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.features = make_backbone()
        self.classifier = nn.Linear(32, n_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


# the "pretrained" checkpoint, as downloaded (kept in memory here)
pretrained = Net(10).state_dict()
pretrained["features.3.bias"][5] = float("nan")
buffer = io.BytesIO()
torch.save(pretrained, buffer)
buffer.seek(0)

model = Net(10)
state = torch.load(buffer, weights_only=True)
if FIXED:  # check the checkpoint: zero the non-finite entries (here one conv bias)
    state = {k: torch.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0) for k, v in state.items()}
model.load_state_dict(state)
model.classifier = nn.Linear(32, 4)  # new task
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
images = torch.rand(128, 3, 16, 16)
labels = torch.randint(0, 4, (128,))
for step in range(20):
    x, y = images[(step * 16) % 128:(step * 16) % 128 + 16], labels[(step * 16) % 128:(step * 16) % 128 + 16]
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
