# expect: {"cause": "nonfinite-input", "phase": "data", "op": "input", "module": null}
# about: held out: written after the suite by someone who had not read it. Gradient accumulation written the "classic" way: backward() on every micro-batch,
# Gradient accumulation written the "classic" way: backward() on every micro-batch,
# optimizer.step() + zero_grad() every 4th. Sensor data streamed from a generator; one
# reading at micro-batch 6 is +inf (a saturated sensor logged as inf).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


def stream(n_batches, bs=16):
    for k in range(n_batches):
        x = torch.randn(bs, 12)
        y = x[:, :4].sum(1) - x[:, 4:8].sum(1) + 0.05 * torch.randn(bs)
        if k == 6:
            x[9, 3] = float("inf")
        yield x, y


model = nn.Sequential(nn.Linear(12, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
ACCUM = 4
running = 0.0
for micro, (x, y) in enumerate(stream(40)):
    loss = F.mse_loss(model(x).squeeze(-1), y) / ACCUM
    loss.backward()
    running += loss.item()
    if (micro + 1) % ACCUM == 0:
        optimizer.step()
        optimizer.zero_grad()
        print(f"update {(micro + 1) // ACCUM - 1} loss {running:.4f}")
        running = 0.0
