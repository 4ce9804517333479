# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.native_layer_norm.default", "module": "encoder.layers.0.norm2"}
# about: a one-layer Transformer encoder regressor trained with SGD(lr=1, momentum=0.9) instead of a small Adam rate; the weights grow every step until the activations are ~1e21 and a LayerNorm's variance overflows (NaN).
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


class SeqModel(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.inp = nn.Linear(6, d)
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1)
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        return self.head(self.encoder(self.inp(x)).mean(1))


x_all = torch.randn(512, 10, 6)
y_all = 3.0 * x_all[:, :, 0].sum(1, keepdim=True)
model = SeqModel()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3 if FIXED else 1.0, momentum=0.9)
for step in range(50):
    idx = torch.randint(0, 512, (32,))
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x_all[idx]), y_all[idx])
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4g}")
print(f"final loss {loss.item():.6g}")
