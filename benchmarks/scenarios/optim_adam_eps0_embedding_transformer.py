# expect: {"cause": "optimizer-state", "phase": "optimizer", "op": ["aten.addcdiv_.default", "aten._foreach_addcdiv_.ScalarList", "aten._foreach_addcdiv_.Tensor"], "module": [null, "embed"]}
# about: a small Transformer classifier trained with Adam(eps=0); embedding rows of tokens absent from the batch get an exactly-zero gradient and their update is 0/0 = NaN.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

VOCAB, D = 200, 32


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        layer = nn.TransformerEncoderLayer(D, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(D, 3)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(1))


tokens = torch.randint(0, VOCAB, (512, 12))
labels = tokens[:, 0] % 3
model = Classifier()
optimizer = torch.optim.Adam(model.parameters(), lr=5e-4, eps=1e-8 if FIXED else 0.0)
for step in range(30):
    tb, yb = tokens[step * 16:(step + 1) * 16], labels[step * 16:(step + 1) * 16]
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(tb), yb)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
