# expect: {"cause": "optimizer-state", "phase": "optimizer", "op": ["aten.addcdiv_.default", "aten._foreach_addcdiv_.ScalarList", "aten._foreach_addcdiv_.Tensor"], "module": [null, "embed"]}
# about: an LSTM language model trained with RMSprop(eps=0); embedding rows of characters that never appear in the batch have a zero gradient and zero running average, so the update is 0/0.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

text = "the quick brown fox jumps over the lazy dog " * 40
chars = [*sorted(set(text)), "<unk>", "<pad>"]
stoi = {c: i for i, c in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text])


class CharLM(nn.Module):
    def __init__(self, vocab, d=24):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, 48, batch_first=True)
        self.head = nn.Linear(48, vocab)

    def forward(self, x):
        out, _ = self.lstm(self.embed(x))
        return self.head(out)


model = CharLM(len(chars))
optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3, eps=1e-8 if FIXED else 0.0)
for step in range(30):
    starts = torch.randint(0, len(data) - 33, (8,))
    x = torch.stack([data[s:s + 32] for s in starts])
    y = torch.stack([data[s + 1:s + 33] for s in starts])
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(x).reshape(-1, len(chars)), y.reshape(-1))
    loss.backward()
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
