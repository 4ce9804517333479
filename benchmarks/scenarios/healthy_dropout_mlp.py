# expect: {"healthy": true}
# about: an MLP classifier with Dropout layers, trained with Adam and a StepLR schedule, switching between train() and eval().
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)

x_all = torch.randn(1024, 20)
y_all = (x_all[:, 0] * x_all[:, 1] > 0).long()
model = nn.Sequential(
    nn.Linear(20, 128), nn.ReLU(), nn.Dropout(0.5),
    nn.Linear(128, 64), nn.ReLU(), nn.Dropout(0.3),
    nn.Linear(64, 2),
)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
for step in range(60):
    idx = torch.randint(0, 1024, (64,))
    model.train()
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x_all[idx]), y_all[idx])
    loss.backward()
    optimizer.step()
    scheduler.step()
    if step % 10 == 0:
        model.eval()
        with torch.no_grad():
            acc = (model(x_all).argmax(1) == y_all).float().mean()
        print(f"step {step} loss {loss.item():.4f} acc {acc:.2f}")
