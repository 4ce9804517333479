# expect: {"cause": "low-precision-overflow", "phase": "forward", "op": "aten.addmm.default", "module": "out"}
# about: held out (round late): an MLP converted with .half() regressing raw house prices (~95k dollars, beyond float16's 65504) with an fp32 L1 loss; the predictions grow towards the targets and the output Linear overflows float16 to inf at step 105.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(6)
torch.set_num_threads(1)

# Synthetic house-price regression: targets are raw prices in dollars (~40k .. 160k),
# features are standardised. The network is converted to half precision to save memory
# and trained with an L1 (MAE) loss, computed in fp32.
N, D = 4096, 16
X = torch.randn(N, D)
w_true = torch.randn(D) * 12000.0
y = (95000.0 + X @ w_true * 0.5 + 3000.0 * torch.randn(N)).clamp(min=20000.0).unsqueeze(1)


class PriceNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.out = nn.Linear(64, 1)

    def forward(self, x):
        return self.out(self.hidden(x))


model = PriceNet().half()
optimizer = torch.optim.SGD(model.parameters(), lr=0.002, momentum=0.9)
batch_size = 256

for step in range(400):
    idx = torch.randint(0, N, (batch_size,))
    xb, yb = X[idx].half(), y[idx]
    pred = model(xb)
    loss = F.l1_loss(pred.float(), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step:4d}  MAE {loss.item():.1f}  mean pred {pred.float().mean().item():.1f}")
