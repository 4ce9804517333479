# expect: {"healthy": true}
# about: held out (round late): a mean/log-variance network fitted with a Gaussian NLL on data whose noise level varies 100x across the input; the loss crosses zero and settles around -1 as the learned log-variance drops, all finite.
import torch
import torch.nn as nn

torch.manual_seed(27)
torch.set_num_threads(1)

# heteroscedastic regression: measurement noise is tiny on the left of the domain
# and large on the right; the model predicts a mean and a log-variance per input.
N = 4000
x = torch.rand(N, 1) * 4 - 2
noise_std = 0.002 + 0.3 * (x + 2) ** 2 / 4
y = torch.sin(2 * x) + noise_std * torch.randn(N, 1)


class MeanVarianceNet(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(1, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU())
        self.mean = nn.Linear(hidden, 1)
        self.log_var = nn.Linear(hidden, 1)

    def forward(self, x):
        h = self.body(x)
        return self.mean(h), self.log_var(h).clamp(-14.0, 6.0)


def gaussian_nll(mu, log_var, y):
    return 0.5 * (log_var + (y - mu) ** 2 * torch.exp(-log_var)).mean()


model = MeanVarianceNet()
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
batch_size = 128

for step in range(400):
    idx = torch.randint(0, N, (batch_size,))
    mu, log_var = model(x[idx])
    loss = gaussian_nll(mu, log_var, y[idx])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 20 == 0:
        print(f"step {step:4d}  nll {loss.item():8.4f}  mean log-var {log_var.mean().item():7.3f}")
