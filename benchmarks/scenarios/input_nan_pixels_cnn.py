# expect: {"cause": "nonfinite-input", "phase": "data", "op": "input", "module": null}
# about: per-image max normalisation in numpy divides a blank image by its max of 0; the NaN image reaches a small CNN through a Dataset/DataLoader.
import os

import numpy as np
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


class Images(torch.utils.data.Dataset):
    def __init__(self, n=384):
        rng = np.random.default_rng(1)
        self.images = rng.integers(0, 256, size=(n, 1, 16, 16)).astype(np.float32)
        self.images[250] = 0.0  # a blank frame from the camera
        self.labels = (self.images.mean(axis=(1, 2, 3)) > 127.5).astype(np.int64)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        img = self.images[i]
        if FIXED:  # a blank frame stays blank instead of 0/0
            img = img / max(float(img.max()), 1.0)
        else:
            with np.errstate(invalid="ignore"):
                img = img / img.max()
        return torch.from_numpy(img), self.labels[i]


model = nn.Sequential(
    nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    nn.Flatten(), nn.Linear(16, 2),
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loader = torch.utils.data.DataLoader(Images(), batch_size=16, shuffle=False)

for step, (x, y) in enumerate(loader):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    if step % 4 == 0:
        print(f"step {step} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
