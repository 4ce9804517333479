# expect: {"healthy": true}
# about: held out: written after the suite by someone who had not read it. Healthy: a small Transformer encoder built from nn.MultiheadAttention with a boolean
# Healthy: a small Transformer encoder built from nn.MultiheadAttention with a boolean
# key_padding_mask (right padding, every sequence has >= 1 real token) plus a float causal
# mask with -inf (nn.Transformer.generate_square_subsequent_mask), pre-LN, masked mean pool.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
V, PAD, T = 50, 0, 24


class EncoderLayer(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, dropout=0.1, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Dropout(0.1), nn.Linear(4 * d, d))

    def forward(self, x, causal, pad):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=causal, key_padding_mask=pad, need_weights=False)
        x = x + a
        return x + self.ff(self.ln2(x))


class Model(nn.Module):
    def __init__(self, d=64, h=4, n=2):
        super().__init__()
        self.emb = nn.Embedding(V, d, padding_idx=PAD)
        self.pos = nn.Parameter(torch.zeros(1, T, d))
        self.layers = nn.ModuleList([EncoderLayer(d, h) for _ in range(n)])
        self.out = nn.Linear(d, 2)

    def forward(self, ids):
        pad = ids == PAD
        causal = nn.Transformer.generate_square_subsequent_mask(ids.size(1))
        x = self.emb(ids) + self.pos[:, :ids.size(1)]
        for layer in self.layers:
            x = layer(x, causal, pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.out((x * keep).sum(1) / keep.sum(1))


ids = torch.randint(1, V, (512, T))
lengths = torch.randint(1, T + 1, (512,))
ids[torch.arange(T)[None, :] >= lengths[:, None]] = PAD
y = (ids[:, 0] > V // 2).long()

model = Model()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for epoch in range(3):
    model.train()
    for i in range(0, 512, 32):
        loss = F.cross_entropy(model(ids[i:i + 32]), y[i:i + 32])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    with torch.no_grad():
        acc = (model(ids[:128]).argmax(-1) == y[:128]).float().mean()
    print(f"epoch {epoch} loss {loss.item():.4f} acc {acc.item():.3f}")
