# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": null}
# about: a small convolutional autoencoder trained with SGD(lr=4, momentum=0.9); the weights and the reconstruction error grow every step until the squared error overflows.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


class AutoEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.ReLU(),
                                     nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU())
        self.decoder = nn.Sequential(nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1), nn.ReLU(),
                                     nn.ConvTranspose2d(8, 1, 4, stride=2, padding=1))

    def forward(self, x):
        return self.decoder(self.encoder(x))


images = torch.rand(256, 1, 16, 16)
model = AutoEncoder()
optimizer = torch.optim.SGD(model.parameters(), lr=0.04 if FIXED else 4.0, momentum=0.9)
for step in range(50):
    x = images[(step * 32) % 256:(step * 32) % 256 + 32]
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), x)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4g}")
print(f"final loss {loss.item():.6g}")
