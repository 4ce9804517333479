# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.sqrt.default", "module": ""}
# about: held out (round late): a curve-fitting MLP with a learned observation-noise variance kept as a raw, unconstrained parameter (sigma = sqrt(noise_var)); on noise-free data Adam drives the variance towards 0 and it steps below zero, so sqrt returns NaN at step 162.
import torch
import torch.nn as nn

torch.manual_seed(2)
torch.set_num_threads(1)

# 1-D curve fitting with a Gaussian likelihood and a learned observation-noise variance
N = 512
x = torch.linspace(-3, 3, N).unsqueeze(1)
y = torch.sin(1.5 * x) + 0.3 * x          # clean simulator output (no measurement noise)


class GaussianRegressor(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.mean_net = nn.Sequential(
            nn.Linear(1, hidden), nn.Tanh(),
            nn.Linear(hidden, hidden), nn.Tanh(),
            nn.Linear(hidden, 1),
        )
        self.noise_var = nn.Parameter(torch.tensor(1.0))   # observation noise variance

    def forward(self, x, y):
        mu = self.mean_net(x)
        sigma = torch.sqrt(self.noise_var)
        nll = torch.log(sigma) + 0.5 * ((y - mu) / sigma) ** 2
        return nll.mean()


model = GaussianRegressor()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
batch_size = 64

for step in range(400):
    idx = torch.randint(0, N, (batch_size,))
    optimizer.zero_grad()
    loss = model(x[idx], y[idx])
    loss.backward()
    optimizer.step()
    if step % 20 == 0:
        print(f"step {step:4d}  nll {loss.item():.4f}  noise_var {model.noise_var.item():.5f}")
