# expect: {"healthy": true}
# about: mixed precision on CPU with torch.autocast("cpu", dtype=torch.bfloat16) around the forward pass of a small CNN + MLP head; the loss is computed in float32.
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)

model = nn.Sequential(
    nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
    nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 3),
)
images = torch.rand(384, 1, 12, 12)
labels = (images.mean(dim=(1, 2, 3)) * 3).long().clamp(0, 2)
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
for step in range(50):
    idx = torch.randint(0, 384, (32,))
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(images[idx])
    loss = nn.functional.cross_entropy(logits.float(), labels[idx])
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f} logits {logits.dtype}")
