# expect: {"cause": "unsafe-op", "phase": "forward", "op": ["aten._softmax.default", "aten.masked_fill.Scalar"], "module": "attn"}
# about: hand-written attention with masked_fill(-inf) for padding; a batch holds a sequence that is all padding, so a softmax row is all -inf and gives 0/0 = NaN.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

VOCAB, D, PAD = 50, 32, 0


class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x, pad_mask):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / D ** 0.5
        # fixed: the dtype's lowest finite value, so an all-padding row gives a uniform softmax
        fill = torch.finfo(scores.dtype).min if FIXED else float("-inf")
        scores = scores.masked_fill(pad_mask[:, None, :], fill)
        return self.out(torch.softmax(scores, dim=-1) @ v)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D, padding_idx=PAD)
        self.attn = Attention(D)
        self.head = nn.Linear(D, 2)

    def forward(self, tokens):
        pad = tokens == PAD
        h = self.attn(self.embed(tokens), pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1).clamp_min(1.0))


lengths = torch.randint(3, 16, (480,))
lengths[283] = 0  # an empty document survived preprocessing
tokens = torch.randint(1, VOCAB, (480, 16))
tokens[torch.arange(16)[None, :] >= lengths[:, None]] = PAD
labels = (tokens[:, 0] % 2).long()

model = Classifier()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(30):
    tb, yb = tokens[step * 16:(step + 1) * 16], labels[step * 16:(step + 1) * 16]
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(tb), yb)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
