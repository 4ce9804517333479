# expect: {"healthy": true}
# about: gradient clipping called with max_norm=float("inf") (clipping disabled from a config) so clip_coef = inf / norm is clamped back to 1; used to log the gradient norm.
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)

config = {"max_grad_norm": float("inf"), "lr": 0.05}
x_all = torch.randn(512, 12)
y_all = torch.sin(x_all[:, :1]) + x_all[:, 1:2]
model = nn.Sequential(nn.Linear(12, 64), nn.Tanh(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
for step in range(60):
    idx = torch.randint(0, 512, (32,))
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x_all[idx]), y_all[idx])
    loss.backward()
    grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=config["max_grad_norm"])
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f} grad norm {grad_norm.item():.3f}")
