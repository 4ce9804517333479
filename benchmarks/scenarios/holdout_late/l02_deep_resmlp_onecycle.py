# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.addmm.default", "module": "blocks.2.fc2"}
# about: held out (round late): a 12-block residual MLP (no normalisation) classifier trained with Nesterov SGD and OneCycleLR(max_lr=0.4); once the ramping lr passes ~0.17 the loss climbs over a few steps and the residual activations overflow in a Linear layer at step 44.
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(11)
torch.set_num_threads(1)

# 8-class classification with a deep residual MLP (no normalisation layers)
N, D, C = 6000, 32, 8
X = torch.randn(N, D)
W = torch.randn(D, C)
labels = (X @ W + 0.5 * torch.sin(3 * X[:, :C])).argmax(1)
loader = DataLoader(TensorDataset(X, labels), batch_size=128, shuffle=True, drop_last=True)


class ResidualBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, h):
        return h + self.fc2(F.gelu(self.fc1(h)))


class DeepResMLP(nn.Module):
    def __init__(self, d_in, width=96, depth=12, n_classes=C):
        super().__init__()
        self.stem = nn.Linear(d_in, width)
        self.blocks = nn.Sequential(*[ResidualBlock(width) for _ in range(depth)])
        self.head = nn.Linear(width, n_classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


model = DeepResMLP(D)
total_steps = 300
optimizer = torch.optim.SGD(model.parameters(), lr=0.4, momentum=0.9, nesterov=True)
# one-cycle policy: ramp up to max_lr over the first 30% of training, then anneal
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.4, total_steps=total_steps)
criterion = nn.CrossEntropyLoss()

step = 0
while step < total_steps:
    for xb, yb in loader:
        logits = model(xb)
        loss = criterion(logits, yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step % 10 == 0:
            acc = (logits.argmax(1) == yb).float().mean()
            print(f"step {step:4d}  lr {scheduler.get_last_lr()[0]:.3f}  loss {loss.item():.4f}  acc {acc.item():.3f}")
        step += 1
        if step >= total_steps:
            break
