# expect: {"cause": "nonfinite-input", "phase": "data", "op": "input", "module": null}
# about: regression targets built with np.log(volume) where one volume is 0, so a target is -inf; a small Transformer encoder is trained on them.
import os

import numpy as np
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

rng = np.random.default_rng(0)
n, seq, d = 512, 12, 16
feats = rng.normal(size=(n, seq, d)).astype(np.float32)
volume = np.exp(feats[:, :, 0].mean(axis=1) + 3.0)
volume[300] = 0.0  # a day without trades
with np.errstate(divide="ignore"):
    target = np.log(volume).astype(np.float32)[:, None]
x_all, y_all = torch.from_numpy(feats), torch.from_numpy(target)
if FIXED:  # drop the rows whose target is not finite (log of a zero volume)
    keep = torch.isfinite(y_all).all(dim=1)
    x_all, y_all = x_all[keep], y_all[keep]


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, nhead=4, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2)
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        return self.head(self.encoder(x).mean(dim=1))


model = Regressor()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(n // 16):
    xb, yb = x_all[step * 16:(step + 1) * 16], y_all[step * 16:(step + 1) * 16]
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(xb), yb)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
