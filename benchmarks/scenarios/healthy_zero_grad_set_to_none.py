# expect: {"healthy": true}
# about: optimizer.zero_grad(set_to_none=True) with a frozen sub-module (requires_grad=False) and a parameter that only gets a gradient on some steps, so .grad is None for part of the run.
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(10, 32), nn.ReLU())
        self.head_a = nn.Linear(32, 1)
        self.head_b = nn.Linear(32, 1)
        for p in self.backbone.parameters():
            p.requires_grad_(False)

    def forward(self, x, task):
        h = self.backbone(x)
        return self.head_a(h) if task == "a" else self.head_b(h)


model = Net()
optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
x_all = torch.randn(512, 10)
y_a, y_b = x_all[:, :1] * 2, x_all[:, 1:2] - 1
for step in range(60):
    task = "a" if step % 3 else "b"
    idx = torch.randint(0, 512, (32,))
    optimizer.zero_grad(set_to_none=True)
    target = y_a if task == "a" else y_b
    loss = nn.functional.mse_loss(model(x_all[idx], task), target[idx])
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step} task {task} loss {loss.item():.4f}")
