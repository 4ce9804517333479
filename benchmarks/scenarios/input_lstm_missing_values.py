# expect: {"cause": "nonfinite-input", "phase": "data", "op": "input", "module": null}
# about: a sensor time series with a NaN gap (a dropped reading) cut into sliding windows for an LSTM forecaster.
import os

import numpy as np
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

t = np.arange(3000, dtype=np.float32)
series = np.sin(t / 20.0) + 0.1 * np.random.default_rng(0).normal(size=t.shape).astype(np.float32)
series[1207:1210] = np.nan  # the logger missed three readings

window = 32
xs = np.stack([series[i:i + window] for i in range(0, 2000, 8)])[..., None]
ys = np.array([series[i + window] for i in range(0, 2000, 8)])[:, None]
x_all, y_all = torch.from_numpy(xs), torch.from_numpy(ys.astype(np.float32))
if FIXED:  # drop the windows that overlap the gap
    keep = torch.isfinite(x_all).flatten(1).all(dim=1) & torch.isfinite(y_all).all(dim=1)
    x_all, y_all = x_all[keep], y_all[keep]


class Forecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(1, 32, batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


model = Forecaster()
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
for step in range(0, len(x_all), 16):
    xb, yb = x_all[step:step + 16], y_all[step:step + 16]
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(xb), yb)
    loss.backward()
    optimizer.step()
    if (step // 16) % 5 == 0:
        print(f"batch {step // 16} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
