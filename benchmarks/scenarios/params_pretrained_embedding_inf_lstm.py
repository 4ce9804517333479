# expect: {"cause": "nonfinite-parameters", "phase": "forward", "op": "parameter", "module": "embed"}
# about: word vectors loaded from a .npy file (written by the script) with one corrupt inf entry, used via nn.Embedding.from_pretrained(freeze=False) in an LSTM classifier; it bites when that word first appears in a batch.
import os
import tempfile

import numpy as np
import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

VOCAB, D = 500, 32
path = os.path.join(tempfile.mkdtemp(), "vectors.npy")
vectors = np.random.default_rng(0).normal(scale=0.3, size=(VOCAB, D)).astype(np.float32)
vectors[431, 7] = np.inf  # a corrupt entry in the vector file
np.save(path, vectors)


class Classifier(nn.Module):
    def __init__(self, weights):
        super().__init__()
        self.embed = nn.Embedding.from_pretrained(weights, freeze=False)
        self.lstm = nn.LSTM(D, 32, batch_first=True)
        self.head = nn.Linear(32, 2)

    def forward(self, tokens):
        _, (h, _) = self.lstm(self.embed(tokens))
        return self.head(h[-1])


weights = torch.from_numpy(np.load(path))
if FIXED:  # check the vector file: zero the corrupt (non-finite) entries
    weights = torch.nan_to_num(weights, nan=0.0, posinf=0.0, neginf=0.0)
model = Classifier(weights)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(0)
tokens = torch.randint(0, 400, (640, 20), generator=g)  # common words only ...
tokens[410, 6] = 431  # ... until a rare word shows up
labels = (tokens[:, 0] > 200).long()
for step in range(40):
    tb, yb = tokens[step * 16:(step + 1) * 16], labels[step * 16:(step + 1) * 16]
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(tb), yb)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
