# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.acos.default", "module": null}
# about: held out (round 4, modern stack): written by someone who had not read the code. Self-supervised embedding learning with an angular (geodesic) loss acos(cosine_similarity(z1, z2)) between two augmented views, written without clamping the cosine to [-1, 1]. The augmentation is a RandomApply with p=0.97, so now and then a row gets both views untouched; identical views give identical embeddings and cosine_similarity can round to 1.0000001, so aten.acos.default returns NaN in the forward (loop step 5, in angular_loss, called from the training loop: module null). The whole step is wrapped in try/except Exception: continue with a "raise FloatingPointError if the loss is not finite" guard, so step 5 is silently skipped and training goes on; at step 9 a cosine of exactly 1.0 passes the forward but AcosBackward (-1/sqrt(1-x^2) -> rsqrt(0) = inf) makes the gradients non-finite, the weights turn NaN, and every later batch is swallowed too ("51 of 60 batches skipped"). The label is the first event, the forward acos at step 5. (Both events hinge on float rounding of the cosine of identical vectors; it is deterministic on this CPU build.)
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)

D_IN, D_EMB = 48, 32
centers = torch.randn(10, D_IN) * 2.0


def sample(b):
    cls = torch.randint(0, 10, (b,))
    return centers[cls] + 0.7 * torch.randn(b, D_IN)


def augment(x, p=0.97):
    """RandomApply([jitter + feature dropout], p): some rows come back untouched."""
    apply = (torch.rand(x.shape[0], 1) < p).float()
    jittered = (x + 0.2 * torch.randn_like(x)) * (torch.rand_like(x) > 0.1).float()
    return apply * jittered + (1 - apply) * x


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D_IN, 128), nn.BatchNorm1d(128), nn.ReLU(),
                                 nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, D_EMB))

    def forward(self, x):
        return self.net(x)


def angular_loss(z1, z2, margin=1.0):
    """geodesic distance on the unit sphere: pull the two views together, push other samples away"""
    pos = torch.acos(F.cosine_similarity(z1, z2, dim=1))
    neg = torch.acos(F.cosine_similarity(z1, z2.roll(1, dims=0), dim=1))
    return pos.mean() + F.relu(margin - neg).mean()


model = Encoder()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
skipped = 0
for step in range(60):
    try:
        x = sample(128)
        v1, v2 = augment(x), augment(x)
        z = model(torch.cat([v1, v2]))
        z1, z2 = z.chunk(2)
        loss = angular_loss(z1, z2)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite loss at step {step}")
        opt.zero_grad()
        loss.backward()
        opt.step()
    except Exception:
        skipped += 1          # bad batch: skip it and keep training
        continue
    if step % 10 == 0:
        print(f"step {step:3d} loss {loss.item():.4f}")
print(f"done: {skipped} of 60 batches skipped, last loss {loss.item():.4f}")
