# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.log.default", "module": ""}
# about: held out (round late): an MLP on two separable blobs with sigmoid outputs and a hand-written BCE -(y log p + (1-y) log(1-p)); as the classifier gets confident p rounds to exactly 1.0 in float32 and log(1-p) gives -inf (then 0*-inf = NaN) at step 57.
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(3)
torch.set_num_threads(1)

# binary classification of two well separated Gaussian blobs
N, D = 4000, 20
centers = torch.randn(2, D) * 1.5
labels = torch.randint(0, 2, (N,))
X = centers[labels] + torch.randn(N, D)
ds = TensorDataset(X, labels.float())
loader = DataLoader(ds, batch_size=100, shuffle=True)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x):
        return torch.sigmoid(self.net(x)).squeeze(1)


def bce(p, y):
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()


model = Classifier()
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

step = 0
while step < 300:
    for xb, yb in loader:
        optimizer.zero_grad()
        p = model(xb)
        loss = bce(p, yb)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            acc = ((p > 0.5).float() == yb).float().mean()
            print(f"step {step:4d}  loss {loss.item():.6f}  acc {acc.item():.3f}")
        step += 1
        if step >= 300:
            break
