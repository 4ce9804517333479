# expect: {"cause": "unsafe-op", "phase": "backward", "op": "aten.div.Tensor", "module": "head"}
# about: held out (round late): a multi-label tagger whose head uses a custom autograd.Function log with a clamped forward but a naive backward grad/p; once a confident tag's sigmoid rounds to 1.0, 1-p is exactly 0 and the backward divides 0/0 (NaN) at step 184.
import torch
import torch.nn as nn

torch.manual_seed(10)
torch.set_num_threads(1)


class ClampedLog(torch.autograd.Function):
    """log(p) with p clamped away from 0 so the forward never returns -inf."""

    @staticmethod
    def forward(ctx, p, floor):
        ctx.save_for_backward(p)
        return torch.log(torch.clamp(p, min=floor))

    @staticmethod
    def backward(ctx, grad_out):
        (p,) = ctx.saved_tensors
        return grad_out / p, None


class TagHead(nn.Module):
    """Independent Bernoulli per tag; returns log p and log (1 - p)."""

    def __init__(self, d_in, n_tags, floor=1e-7):
        super().__init__()
        self.proj = nn.Linear(d_in, n_tags)
        self.floor = floor

    def forward(self, h):
        p = torch.sigmoid(self.proj(h))
        return ClampedLog.apply(p, self.floor), ClampedLog.apply(1 - p, self.floor)


class Tagger(nn.Module):
    def __init__(self, d_in, n_tags):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d_in, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
        self.head = TagHead(128, n_tags)

    def forward(self, x):
        return self.head(self.encoder(x))


# multi-label tagging: each item has a few of 12 tags, determined by its features
N, D, T = 5000, 30, 12
X = torch.randn(N, D)
W = torch.randn(D, T)
Y = ((X @ W) > 1.0).float()

model = Tagger(D, T)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
batch_size = 100

for step in range(400):
    idx = torch.randint(0, N, (batch_size,))
    log_p, log_1mp = model(X[idx])
    y = Y[idx]
    loss = -(y * log_p + (1 - y) * log_1mp).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step:4d}  bce {loss.item():.5f}")
