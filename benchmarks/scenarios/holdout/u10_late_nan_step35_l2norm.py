# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.div.Tensor", "module": "l2", "step": 35}
# about: held out (round 2): written after the code by someone who had not read it or the suite. a small image-embedding model (conv, bias=False everywhere "because BatchNorm-free
# nets don't need biases") trained with a cosine-similarity prototype classifier. The L2
# normalisation is a hand-written module: x / x.norm(dim=1, keepdim=True). For 35 steps all
# is fine; batch 35 contains a blank (all-zero) frame from a dropped camera feed: with no
# biases the embedding is exactly zero, norm = 0 and 0/0 = NaN in the forward of module l2.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)


class L2Normalize(nn.Module):
    def forward(self, x):
        return x / x.norm(dim=1, keepdim=True)


class Embedder(nn.Module):
    def __init__(self, dim=32, classes=6):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(16, dim, bias=False),
        )
        self.l2 = L2Normalize()
        self.prototypes = nn.Parameter(torch.randn(classes, dim))
        self.scale = 10.0

    def forward(self, x):
        z = self.l2(self.features(x))
        return self.scale * z @ F.normalize(self.prototypes, dim=1).t()


imgs = torch.rand(60 * 16, 1, 12, 12)
labels = torch.randint(0, 6, (60 * 16,))
imgs += labels.view(-1, 1, 1, 1) * 0.1
imgs[35 * 16 + 9] = 0.0                      # the blank frame, row 9 of batch 35

model = Embedder()
opt = torch.optim.RMSprop(model.parameters(), lr=1e-3)
for step in range(60):
    x, y = imgs[step * 16:(step + 1) * 16], labels[step * 16:(step + 1) * 16]
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 5 == 0:
        print(f"step {step:2d} loss {loss.item():.4f}")
