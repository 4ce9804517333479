# expect: {"healthy": true}
# about: a two-layer network trained with a hand-written SGD update under torch.no_grad() (p -= lr * p.grad; p.grad = None) and no torch.optim optimizer at all.
import torch

torch.manual_seed(0)
torch.set_num_threads(1)

x = torch.randn(256, 5)
y = (x[:, :1] - 2 * x[:, 1:2]).tanh()
w1 = (torch.randn(5, 32) / 5 ** 0.5).requires_grad_()
b1 = torch.zeros(32, requires_grad=True)
w2 = (torch.randn(32, 1) / 32 ** 0.5).requires_grad_()
b2 = torch.zeros(1, requires_grad=True)
params = [w1, b1, w2, b2]
lr = 0.1
for step in range(80):
    idx = torch.randint(0, 256, (32,))
    h = torch.relu(x[idx] @ w1 + b1)
    loss = ((h @ w2 + b2 - y[idx]) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad
            p.grad = None
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}")
