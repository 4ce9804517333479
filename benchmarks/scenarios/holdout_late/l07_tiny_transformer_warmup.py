# expect: {"healthy": true}
# about: held out (round late): a 2-layer TransformerEncoder sequence classifier with AdamW, 60-step linear lr warmup (30x ramp) then cosine decay and grad clipping; the loss bumps up during warmup and then drops to ~1e-4, all finite.
import math
import torch
import torch.nn as nn

torch.manual_seed(25)
torch.set_num_threads(1)

# sequence classification: does token 3 occur more often than token 5?
V, L, N = 12, 24, 8000
seqs = torch.randint(0, V, (N, L))
labels = ((seqs == 3).sum(1) > (seqs == 5).sum(1)).long()


class TinyTransformer(nn.Module):
    def __init__(self, vocab, d_model=48, nhead=4, layers=2, max_len=L):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=96, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.cls = nn.Linear(d_model, 2)

    def forward(self, x):
        h = self.encoder(self.tok(x) + self.pos)
        return self.cls(h.mean(1))


model = TinyTransformer(V)
total_steps, warmup = 300, 60
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)


def lr_lambda(step):
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total_steps - warmup)))


scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
criterion = nn.CrossEntropyLoss()
batch_size = 64

for step in range(total_steps):
    idx = torch.randint(0, N, (batch_size,))
    logits = model(seqs[idx])
    loss = criterion(logits, labels[idx])
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    if step % 10 == 0:
        acc = (logits.argmax(1) == labels[idx]).float().mean()
        print(f"step {step:4d}  lr {scheduler.get_last_lr()[0]:.2e}  loss {loss.item():.4f}  acc {acc.item():.3f}")
