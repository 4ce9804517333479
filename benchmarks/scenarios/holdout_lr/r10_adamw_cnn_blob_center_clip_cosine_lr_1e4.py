# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": null}
# about: held out (lr round): small CNN regressing a blob's centre in synthetic RGB images, AdamW + clip_grad_norm_(1.0) + cosine schedule at lr=1e4 instead of a sane 1e-3 (10^7x), after one Adam step the prediction is so large that F.mse_loss is inf at step 1.
"""Regress the (row, col) centre of a Gaussian blob in synthetic RGB images with a small CNN; AdamW, clip, cosine."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"

HW = 16


def blob_images(n):
    yy, xx = torch.meshgrid(torch.arange(HW).float(), torch.arange(HW).float(), indexing="ij")
    centre = 2.0 + (HW - 4.0) * torch.rand(n, 2)
    d2 = (yy - centre[:, 0, None, None]) ** 2 + (xx - centre[:, 1, None, None]) ** 2
    blob = torch.exp(-d2 / 6.0)
    color = torch.rand(n, 3, 1, 1) + 0.3
    img = color * blob[:, None] + 0.2 * torch.randn(n, 3, HW, HW)
    target = centre / HW - 0.5          # in [-0.375, 0.375]
    return img, target


class CentreNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 2)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def run(lr, steps=150, batch=32):
    torch.manual_seed(0)
    net = CentreNet()
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=lr * 0.01)
    for step in range(steps):
        x, y = blob_images(batch)
        loss = F.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(net.parameters(), max_norm=1.0)
        opt.step()
        sched.step()
        if step % 15 == 0:
            print(f"step {step} loss {loss.item():.5f}")
    torch.manual_seed(1)
    x, y = blob_images(256)
    with torch.no_grad():
        return F.mse_loss(net(x), y).item()


if __name__ == "__main__":
    learning_rate = 1e-3 if FIXED else 1e4
    print(f"final loss {run(learning_rate)}")
