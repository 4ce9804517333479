# expect: {"healthy": true}
# about: held out (round late): linear regression on raw targets (mean ~120) from zero-initialised weights with SGD momentum 0.9; the MSE starts around 1.5e4 and drops by three orders of magnitude, all finite.
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(21)
torch.set_num_threads(1)

# predict a building's daily energy use (raw kWh, mean ~120) from standardised sensors
N, D = 2048, 10
X = torch.randn(N, D)
w_true = torch.randn(D) * 8.0
y = 120.0 + X @ w_true + 2.0 * torch.randn(N)
loader = DataLoader(TensorDataset(X, y), batch_size=32, shuffle=True)

model = nn.Linear(D, 1)
with torch.no_grad():
    model.weight.zero_()
    model.bias.zero_()

optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = nn.MSELoss()

step = 0
for epoch in range(6):
    for xb, yb in loader:
        pred = model(xb).squeeze(1)
        loss = loss_fn(pred, yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            print(f"epoch {epoch} step {step:4d}  mse {loss.item():10.3f}  bias {model.bias.item():8.3f}")
        step += 1
