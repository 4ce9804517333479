# expect: {"cause": "unsafe-op", "phase": "backward", "op": "aten.div.Tensor", "module": null}
# about: a CLIP-style contrastive loss on two small Transformer encoders written as log(softmax(sim / 0.005)); the softmax of a positive pair underflows to a denormal, log stays finite but its backward 1/p overflows.
import os

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

D = 32


class Tower(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.embed = nn.Embedding(vocab, D)
        layer = nn.TransformerEncoderLayer(D, 4, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1)
        self.proj = nn.Linear(D, D)

    def forward(self, tokens):
        return F.normalize(self.proj(self.encoder(self.embed(tokens)).mean(1)), dim=-1)


class Clip(nn.Module):
    def __init__(self):
        super().__init__()
        self.text = Tower(100)
        self.image = Tower(64)

    def forward(self, text, image):
        return self.text(text), self.image(image)


model = Clip()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
temperature = 0.005
for step in range(30):
    text = torch.randint(0, 100, (16, 8))
    image = (text * 7) % 64
    optimizer.zero_grad()
    zt, zi = model(text, image)
    sim = zt @ zi.t() / temperature
    if FIXED:  # log_softmax: no log of an underflowed probability
        loss = -torch.diagonal(F.log_softmax(sim, dim=1)).mean()
    else:
        p = torch.softmax(sim, dim=1)
        loss = -torch.log(torch.diagonal(p)).mean()
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
