# expect: {"cause": "exploding-gradients", "phase": "backward", "op": ["aten.mm.default", "aten.add.Tensor"], "module": "cell"}
# about: a hand-unrolled tanh RNNCell with a large recurrent init (chaotic regime: forward bounded by 1, gradients grow geometrically with length); one batch of very long sequences overflows the backward.
# platform: which op first overflows at step 14 depends on MKL's code path: a time step's weight-gradient `mm` (MKL_CBWR=AVX) or the engine's `add` summing those gradients over time (AVX-512), both in `cell`'s backward.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


class CharRNN(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.hidden = hidden
        self.cell = nn.RNNCell(4, hidden)
        self.head = nn.Linear(hidden, 1)
        nn.init.normal_(self.cell.weight_hh, 0.0, 0.35)

    def forward(self, x):
        h = torch.zeros(x.shape[0], self.hidden)
        for t in range(x.shape[1]):
            if FIXED and t and t % 30 == 0:
                h = h.detach()  # truncated backpropagation through time
            h = self.cell(x[:, t], h)
        return self.head(h)


def batches(n_batches=30):
    g = torch.Generator().manual_seed(1)
    for i in range(n_batches):
        length = 600 if i == 14 else int(torch.randint(15, 30, (1,), generator=g))
        x = torch.randn(8, length, 4, generator=g)
        yield x, x[:, -5:, 0].mean(1, keepdim=True)


model = CharRNN()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step, (x, y) in enumerate(batches()):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    if FIXED:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=5)
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} length {x.shape[1]} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
