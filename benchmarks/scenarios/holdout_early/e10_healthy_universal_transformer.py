# expect: {"healthy": true}
# about: held out (round early): A universal-transformer-style model applies one weight-shared pre-norm encoder block 12 times (with a per-iteration step embedding) to learn to sort short digit sequences; trained with AdamW, warm-up and clipping, it stays finite and the loss falls.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)

VOCAB, L, D, ITERS = 10, 12, 64, 12


def make_batch(n):
    x = torch.randint(0, VOCAB, (n, L))
    y, _ = torch.sort(x, dim=1)
    return x, y


class UniversalTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Parameter(0.02 * torch.randn(L, D))
        self.step_emb = nn.Parameter(0.02 * torch.randn(ITERS, D))
        self.block = nn.TransformerEncoderLayer(D, nhead=4, dim_feedforward=128, dropout=0.0,
                                                batch_first=True, norm_first=True)
        self.norm = nn.LayerNorm(D)
        self.out = nn.Linear(D, VOCAB)

    def forward(self, x):
        h = self.tok(x) + self.pos
        for k in range(ITERS):                        # same block, applied again and again
            h = self.block(h + self.step_emb[k])
        return self.out(self.norm(h))


model = UniversalTransformer()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))

for step in range(80):
    x, y = make_batch(64)
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    if step % 5 == 0 or step == 79:
        acc = (logits.argmax(-1) == y).float().mean()
        print(f"step {step:3d} loss {loss.item():.4f} token-acc {acc.item():.3f}")
