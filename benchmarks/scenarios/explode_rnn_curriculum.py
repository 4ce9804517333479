# expect: {"cause": "exploding-gradients", "phase": "optimizer", "op": ["aten.addcmul_.default", "aten._foreach_addcmul_.Scalar"], "module": [null, "rnn"]}
# about: a vanilla ReLU RNN with gain-1.4 identity recurrent weights trained on ever longer sequences; the gradients explode over the steps (finite, ~1e21) and Adam's second moment grad*grad overflows first.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


class SeqRegressor(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.rnn = nn.RNN(4, hidden, nonlinearity="relu", batch_first=True)
        self.head = nn.Linear(hidden, 1)
        with torch.no_grad():
            self.rnn.weight_hh_l0.copy_(GAIN * torch.eye(hidden) + 0.01 * torch.randn(hidden, hidden))

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


GAIN = 1.0 if FIXED else 1.4  # fixed: an identity (IRNN) init, no growth
model = SeqRegressor()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(60):
    length = 10 + 5 * step  # curriculum: longer sequences as training goes on
    x = torch.rand(16, length, 4)
    y = x.sum(dim=(1, 2)).unsqueeze(1)
    optimizer.zero_grad()
    loss = nn.functional.l1_loss(model(x), y)
    loss.backward()
    if FIXED:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} length {length} loss {loss.item():.4g}")
print(f"final loss {loss.item():.6g}")
