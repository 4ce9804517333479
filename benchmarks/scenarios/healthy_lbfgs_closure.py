# expect: {"healthy": true}
# about: full-batch logistic regression with torch.optim.LBFGS and a closure that zeroes the gradients, computes the loss and calls backward (several evaluations per step).
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)

x = torch.randn(400, 8)
w_true = torch.randn(8, 1)
y = (x @ w_true + 0.3 * torch.randn(400, 1) > 0).float()
model = nn.Linear(8, 1)
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=10, history_size=5,
                              line_search_fn="strong_wolfe")
loss_fn = nn.BCEWithLogitsLoss()


def closure():
    optimizer.zero_grad()
    loss = loss_fn(model(x), y) + 1e-3 * model.weight.pow(2).sum()
    loss.backward()
    return loss


for step in range(30):
    loss = optimizer.step(closure)
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
