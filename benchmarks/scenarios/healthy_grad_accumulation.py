# expect: {"healthy": true}
# about: gradient accumulation: four micro-batches per optimizer step, each loss divided by 4, backward on every micro-batch and one optimizer.step()/zero_grad() every fourth.
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)

ACCUM = 4
x_all = torch.randn(2048, 16)
y_all = (x_all[:, :3].sum(1) > 0).long()
model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
optimizer.zero_grad()
for micro in range(160):
    idx = torch.randint(0, 2048, (16,))
    loss = nn.functional.cross_entropy(model(x_all[idx]), y_all[idx]) / ACCUM
    loss.backward()
    if (micro + 1) % ACCUM == 0:
        optimizer.step()
        optimizer.zero_grad()
        if (micro + 1) % 40 == 0:
            print(f"update {(micro + 1) // ACCUM} loss {loss.item() * ACCUM:.4f}")
