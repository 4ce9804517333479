# expect: {"healthy": true}
# about: a tiny GPT-style language model whose hand-written attention applies a causal mask with masked_fill(mask, float("-inf")); every row keeps at least one finite score.
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)

VOCAB, D, T, H = 30, 32, 16, 4


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def forward(self, x):
        B = x.shape[0]
        q, k, v = self.qkv(x).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / (D // H) ** 0.5
        att = att.masked_fill(~self.mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, D))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(torch.zeros(T, D))
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = CausalSelfAttention()
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.head = nn.Linear(D, VOCAB)

    def forward(self, idx):
        x = self.tok(idx) + self.pos
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return self.head(x)


text = torch.tensor([(i * 7 + i // 3) % VOCAB for i in range(3000)])
model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
for step in range(60):
    starts = torch.randint(0, len(text) - T - 1, (16,))
    x = torch.stack([text[s:s + T] for s in starts])
    y = torch.stack([text[s + 1:s + T + 1] for s in starts])
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}")
