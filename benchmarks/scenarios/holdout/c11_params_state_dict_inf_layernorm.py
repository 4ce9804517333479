# expect: {"cause": "nonfinite-parameters", "phase": "forward", "op": "parameter", "module": "blocks.1.norm"}
# guess before tracer: the weights are bad before any op; the first op to consume it is the layer_norm in blocks.1.norm (native_layer_norm), but the origin is the parameter itself reftrace: origin is the loaded storage (aten.set_ in load_state_dict), i.e. pre-existing; consumed first in blocks.1.norm at step 0.
# about: held out (round 3): written after the code by someone who had not read it or the suite. resuming a small pre-norm MLP-mixer-like regressor from a state_dict (saved to an in-memory buffer and reloaded) in which one LayerNorm weight entry became inf in the run that wrote it; loaded with load_state_dict, then fine-tuned with AdamW.
import io

import torch
from torch import nn

torch.manual_seed(12)
torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class Net(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.blocks = nn.Sequential(Block(d), Block(d), Block(d))
        self.out = nn.Linear(d, 1)

    def forward(self, x):
        return self.out(self.blocks(self.inp(x)))


# the earlier run's checkpoint (written here so nothing is downloaded)
old = Net()
sd = old.state_dict()
sd["blocks.1.norm.weight"][7] = float("inf")
buf = io.BytesIO()
torch.save(sd, buf)
buf.seek(0)

model = Net()
model.load_state_dict(torch.load(buf, weights_only=True))
X = torch.randn(512, 8)
Y = X[:, :1] * X[:, 1:2] + X[:, 2:3]
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(30):
    s = slice(step * 32 % 512, step * 32 % 512 + 32)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X[s]), Y[s])
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4g}")
