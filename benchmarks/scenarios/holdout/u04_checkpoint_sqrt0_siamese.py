# expect: {"cause": "unsafe-op", "phase": "backward", "op": "aten.div.Tensor", "module": "head", "grad_fn": "SqrtBackward0"}
# about: held out (round 2): written after the code by someone who had not read it or the suite. a Siamese net trained with a contrastive loss; the distance head runs under
# torch.utils.checkpoint (use_reentrant=False) to save memory. The pair sampler sometimes
# pairs a sample with itself (positive pair, no augmentation), so the two embeddings are
# identical, ((a-b)**2).sum() == 0 and the forward sqrt(0) = 0 is fine -- but SqrtBackward
# divides by 2*sqrt(0) = 0 -> inf (then inf*0 = NaN in PowBackward). The checkpointed head
# is re-run (forward recomputation) during the backward pass. Pair (7, 7) is in batch 3.
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

torch.manual_seed(0)
torch.set_num_threads(1)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.stages = nn.ModuleList([
            nn.Sequential(nn.Linear(16, 64), nn.GELU()),
            nn.Sequential(nn.Linear(64, 32), nn.LayerNorm(32)),
        ])

    def forward(self, x):
        for s in self.stages:
            x = s(x)
        return x


class DistanceHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 16)

    def forward(self, a, b):
        pa, pb = self.proj(a), self.proj(b)
        return torch.sqrt(((pa - pb) ** 2).sum(dim=1))


class Siamese(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder()
        self.head = DistanceHead()

    def forward(self, x1, x2):
        e1, e2 = self.encoder(x1), self.encoder(x2)
        return checkpoint(self.head, e1, e2, use_reentrant=False)


def contrastive(d, same, margin=1.0):
    return (same * d.pow(2) + (1 - same) * F.relu(margin - d).pow(2)).mean()


g = torch.Generator().manual_seed(123)
feats = torch.randn(500, 16, generator=g)
cls = torch.randint(0, 5, (500,), generator=g)
model = Siamese()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(20):
    i = torch.randint(0, 500, (64,), generator=g)
    j = torch.randint(0, 500, (64,), generator=g)
    if step == 3:
        j[10] = i[10]                     # the sampler drew the same index twice
    same = (cls[i] == cls[j]).float()
    d = model(feats[i], feats[j])
    loss = contrastive(d, same)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step:2d} loss {loss.item():.4f}")
