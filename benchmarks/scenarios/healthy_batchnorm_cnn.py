# expect: {"healthy": true}
# about: a CNN with BatchNorm2d layers trained with SGD + momentum and weight decay, then evaluated in eval() mode on a held-out batch.
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)

model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    nn.Flatten(), nn.Linear(32, 4),
)
images = torch.rand(512, 3, 16, 16)
labels = images.mean(dim=(2, 3)).argmax(1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
for step in range(50):
    idx = torch.randint(0, 448, (32,))
    model.train()
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(images[idx]), labels[idx])
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        model.eval()
        with torch.no_grad():
            acc = (model(images[448:]).argmax(1) == labels[448:]).float().mean()
        print(f"step {step} loss {loss.item():.4f} val acc {acc:.2f}")
