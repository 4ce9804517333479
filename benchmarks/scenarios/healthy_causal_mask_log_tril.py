# expect: {"healthy": true}
# about: an additive causal mask built as torch.log(torch.tril(torch.ones(T, T))) (0 on and below the diagonal, -inf above) added to the attention scores of a small Transformer.
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)

VOCAB, D, T = 24, 32, 12


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x, mask):
        scores = self.q(x) @ self.k(x).transpose(-2, -1) / D ** 0.5
        return F.softmax(scores + mask, dim=-1) @ self.v(x)


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.head_attn = Head()
        self.norm = nn.LayerNorm(D)
        self.out = nn.Linear(D, VOCAB)

    def forward(self, idx):
        mask = torch.log(torch.tril(torch.ones(T, T)))
        x = self.embed(idx)
        return self.out(self.norm(x + self.head_attn(x, mask)))


data = torch.tensor([(3 * i * i + i) % VOCAB for i in range(2000)])
model = LM()
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
for step in range(60):
    starts = torch.randint(0, len(data) - T - 1, (16,))
    x = torch.stack([data[s:s + T] for s in starts])
    y = torch.stack([data[s + 1:s + T + 1] for s in starts])
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}")
