# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mm.default", "module": null}
# about: held out: written after the suite by someone who had not read it. "Neural network from scratch": no nn.Module, no optimizer. Two-layer tanh regressor with
# "Neural network from scratch": no nn.Module, no optimizer. Two-layer tanh regressor with
# raw tensors, manual gradient descent with W.data -= lr * W.grad. The features are not
# standardised (house-price style: areas in the thousands), so lr=3e-4 (copied from an Adam example) is far too high for plain GD.
import torch

torch.manual_seed(0)
N = 256
area = torch.rand(N, 1) * 3000 + 500
rooms = torch.randint(1, 6, (N, 1)).float()
X = torch.cat([area / 100, rooms], 1)          # "scaled" area: 5..35
y = 0.8 * X[:, :1] + 3 * X[:, 1:] + torch.randn(N, 1)

W1 = torch.randn(2, 16, requires_grad=True)
b1 = torch.zeros(16, requires_grad=True)
W2 = torch.randn(16, 1, requires_grad=True)
b2 = torch.zeros(1, requires_grad=True)
lr = 3e-4

for it in range(100):
    h = X @ W1 + b1
    pred = h @ W2 + b2                       # (forgot the nonlinearity: linear model)
    loss = ((pred - y) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        for p in (W1, b1, W2, b2):
            p.data -= lr * p.grad
            p.grad.zero_()
    if it % 2 == 0:
        print(f"iter {it} loss {loss.item():.4e}")
