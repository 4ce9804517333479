# expect: {"healthy": true}
# about: held out (round late): an MLP on well-separated Gaussian classes plus 1% ambiguous boundary points, trained with Adam to near-zero loss; late per-batch losses jump between ~1e-4 and ~1e-1 depending on whether a batch holds a hard point, but everything stays finite.
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(24)
torch.set_num_threads(1)

# 5-class classification; a small set of ambiguous examples sits near the class
# boundaries, so once the easy ones are fitted the per-batch loss depends on
# whether a batch happens to contain one of them.
N, D, C = 3000, 20, 5
centers = torch.randn(C, D) * 3.0
labels = torch.randint(0, C, (N,))
X = centers[labels] + 0.7 * torch.randn(N, D)
hard = torch.rand(N) < 0.01
other = (labels + torch.randint(1, C, (N,))) % C
X[hard] = 0.5 * (centers[labels[hard]] + centers[other[hard]]) + 0.3 * torch.randn(int(hard.sum()), D)
loader = DataLoader(TensorDataset(X, labels), batch_size=32, shuffle=True, drop_last=True)

model = nn.Sequential(nn.Linear(D, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, C))
optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
criterion = nn.CrossEntropyLoss()

step = 0
while step < 400:
    for xb, yb in loader:
        loss = criterion(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 0 or step > 380:
            print(f"step {step:4d}  loss {loss.item():.3e}")
        step += 1
        if step >= 400:
            break
