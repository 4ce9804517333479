# expect: {"cause": "bad-initialization", "phase": "forward", "op": "aten.addmm.default", "module": "rnn"}
# about: a ReLU nn.RNN whose recurrent weights are initialised with nn.init.normal_(w, 0, 1); the hidden state grows ~8x per time step and overflows within the first sequence.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


class Tagger(nn.Module):
    def __init__(self, hidden=128):
        super().__init__()
        self.rnn = nn.RNN(16, hidden, nonlinearity="relu", batch_first=True)
        self.head = nn.Linear(hidden, 3)
        for name, p in self.rnn.named_parameters():
            if "weight" in name:
                # fixed: std 1/sqrt(hidden) (the scale of PyTorch's own init) instead of 1
                nn.init.normal_(p, 0.0, hidden ** -0.5 if FIXED else 1.0)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out)


model = Tagger()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
x_all = torch.randn(256, 60, 16)
y_all = (x_all[..., 0] > 0).long() + (x_all[..., 1] > 1).long()
for step in range(30):
    idx = torch.arange(step * 16, step * 16 + 16) % 256
    optimizer.zero_grad()
    logits = model(x_all[idx])
    loss = nn.functional.cross_entropy(logits.reshape(-1, 3), y_all[idx].reshape(-1))
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4g}")
print(f"final loss {loss.item():.6g}")
