# expect: {"healthy": true}
# about: held out: written after the suite by someone who had not read it. Bag-of-embeddings text classifier with cosine-similarity logits (normalised features and
# Bag-of-embeddings text classifier with cosine-similarity logits (normalised features and
# normalised class prototypes). Padding tokens map to nn.Embedding's padding_idx row, which
# is all zeros, and the custom module L2-normalises every token vector with F.normalize --
# including those all-zero padding vectors (and some sentences are fully padded).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
V, PAD, T, C = 500, 0, 12, 3


class NormalizedTokens(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.emb = nn.Embedding(V, d, padding_idx=PAD)

    def forward(self, ids):
        return F.normalize(self.emb(ids), dim=-1)       # pad rows: zero vector -> normalize


class CosineClassifier(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.tokens = NormalizedTokens(d)
        self.mix = nn.Linear(d, d)
        self.prototypes = nn.Parameter(torch.randn(C, d))
        self.scale = 10.0

    def forward(self, ids):
        tok = self.tokens(ids)                          # [B, T, d]
        sent = F.normalize(self.mix(tok.sum(1)), dim=-1)
        return self.scale * sent @ F.normalize(self.prototypes, dim=-1).t()


ids = torch.randint(1, V, (640, T))
lengths = torch.randint(0, T + 1, (640,))
ids[torch.arange(T)[None, :] >= lengths[:, None]] = PAD    # right padding; length 0 rows exist
labels = ids[:, 0] % C

model = CosineClassifier()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for epoch in range(3):
    for i in range(0, 640, 64):
        loss = F.cross_entropy(model(ids[i:i + 64]), labels[i:i + 64])
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f} fully padded rows: {(lengths == 0).sum().item()}")
