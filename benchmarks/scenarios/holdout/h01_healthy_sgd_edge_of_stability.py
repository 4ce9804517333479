# expect: {"healthy": true}
# about: held out (round 3): written after the code by someone who had not read it or the suite. control: linear regression on whitened features with SGD at lr=0.9 (just under the 2/lambda_max = 1.0 stability edge of the mean-squared-error Hessian 2*E[xx^T]=2I): the loss oscillates in sign of the error but converges; no NaN/Inf anywhere.
import torch
from torch import nn

torch.manual_seed(20)
torch.set_num_threads(1)
X = torch.randn(8192, 16)
X = (X - X.mean(0)) / X.std(0)
Y = X @ torch.randn(16, 1) + 0.05 * torch.randn(8192, 1)
model = nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.9)
for step in range(60):
    s = slice(step * 512 % 8192, step * 512 % 8192 + 512)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X[s]), Y[s])
    loss.backward()
    opt.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.6g}")
print("final weight norm", round(model.weight.norm().item(), 6))
