# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": ""}
# about: held out (round late): a 4-layer GELU MLP regressor with SGD+momentum whose LambdaLR 'warmup' factor (s+1)/25 is never capped, so the lr keeps rising linearly past the stability limit; the weights and predictions blow up and the MSE loss overflows to inf at step 98.
import math
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)

# synthetic regression data: y = smooth nonlinear function of x
N, D = 2048, 32
X = torch.randn(N, D)
w_true = torch.randn(D, 1) / math.sqrt(D)
y = torch.tanh(X @ w_true) * 3.0 + 0.5 * (X[:, :1] ** 2) + 0.1 * torch.randn(N, 1)


class MLP(nn.Module):
    def __init__(self, d_in, width=128, depth=4):
        super().__init__()
        layers = []
        d = d_in
        for _ in range(depth):
            layers += [nn.Linear(d, width), nn.GELU()]
            d = width
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        return self.head(self.body(x))


model = MLP(D)
base_lr = 0.1
warmup_steps = 25
total_steps = 300
optimizer = torch.optim.SGD(model.parameters(), lr=base_lr, momentum=0.9)

# linear warmup of the learning rate ("ramp up over the first 25 steps")
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (s + 1) / warmup_steps)
loss_fn = nn.MSELoss()
batch_size = 128

for step in range(total_steps):
    idx = torch.randint(0, N, (batch_size,))
    xb, yb = X[idx], y[idx]
    optimizer.zero_grad()
    pred = model(xb)
    loss = loss_fn(pred, yb)
    loss.backward()
    optimizer.step()
    scheduler.step()
    if step % 10 == 0:
        print(f"step {step:4d}  lr {scheduler.get_last_lr()[0]:.4f}  loss {loss.item():.4f}")
