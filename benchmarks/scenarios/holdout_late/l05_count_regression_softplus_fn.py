# expect: {"cause": "unsafe-op", "phase": "backward", "op": "aten.exp.default", "module": "link"}
# about: held out (round late): a Poisson count regressor whose rate link is a custom autograd.Function softplus with a stable forward but a naive backward exp(x)/(1+exp(x)); as the predicted rates for high-count samples grow past ~88.7 the backward exp overflows (inf/inf -> NaN) at step 147.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(9)
torch.set_num_threads(1)


class StableSoftplus(torch.autograd.Function):
    """softplus(x) = log(1 + exp(x)), computed without overflow in the forward pass."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.clamp(x, min=0) + torch.log1p(torch.exp(-torch.abs(x)))

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        ex = torch.exp(x)
        return grad_out * ex / (1 + ex)       # d/dx softplus = sigmoid(x)


class SoftplusLink(nn.Module):
    def forward(self, x):
        return StableSoftplus.apply(x)


class CountRegressor(nn.Module):
    """Predicts the expected number of events; softplus keeps the rate positive."""

    def __init__(self, d_in, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.rate_head = nn.Linear(hidden, 1)
        self.link = SoftplusLink()

    def forward(self, x):
        return self.link(self.rate_head(self.body(x))).squeeze(1)


# synthetic event counts per store and day: rates from ~1 to a few hundred
N, D = 4096, 10
X = torch.randn(N, D)
true_rate = torch.exp(2.5 + 0.8 * X[:, 0] + 0.5 * X[:, 1] - 0.3 * X[:, 2])
y = torch.poisson(true_rate)

model = CountRegressor(D)
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
batch_size = 128

for step in range(400):
    idx = torch.randint(0, N, (batch_size,))
    rate = model(X[idx])
    loss = F.poisson_nll_loss(rate, y[idx], log_input=False)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step:4d}  poisson nll {loss.item():.3f}  max rate {rate.max().item():.1f}")
