# expect: {"cause": "unsafe-op", "phase": "backward", "op": "aten.div.Tensor", "module": null}
# about: a siamese LSTM with a contrastive loss on the Euclidean distance sqrt(sum((a - b)**2)); a pair that holds the same sequence twice has distance 0 and SqrtBackward divides by 0.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 24, batch_first=True)
        self.proj = nn.Linear(24, 8)

    def forward(self, x):
        _, (h, _) = self.lstm(x)
        return self.proj(h[-1])


def contrastive_loss(za, zb, same, margin=2.0):
    sq = ((za - zb) ** 2).sum(dim=1)
    dist = torch.sqrt(sq + 1e-12) if FIXED else torch.sqrt(sq)  # fixed: safe at distance 0
    return (same * dist ** 2 + (1 - same) * torch.relu(margin - dist) ** 2).mean()


sequences = torch.randn(300, 10, 4)
classes = torch.randint(0, 5, (300,))
encoder = Encoder()
optimizer = torch.optim.Adam(encoder.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)  # the pair sampler may draw the same sequence twice
for step in range(40):
    i = torch.randint(0, 300, (32,), generator=g)
    j = torch.randint(0, 300, (32,), generator=g)
    same = (classes[i] == classes[j]).float()
    optimizer.zero_grad()
    loss = contrastive_loss(encoder(sequences[i]), encoder(sequences[j]), same)
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
