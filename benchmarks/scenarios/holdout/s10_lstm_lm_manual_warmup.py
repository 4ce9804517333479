# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.sum.default", "module": null}
# about: held out: written after the suite by someone who had not read it. Word-level LSTM language model (PyTorch word_language_model style) with a hand-written
# Word-level LSTM language model (PyTorch word_language_model style) with a hand-written
# linear-warmup schedule set every step through opt.param_groups, and an L2 penalty written
# into the loss. The peak lr (40, as in the example's README) was meant for a run without
# that penalty; with it, lr * 2 * l2 > 2 once warmup passes lr = 10: the weights oscillate
# and grow.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
V, T, B = 200, 20, 16
probs = 1.0 / torch.arange(1, V + 1).float()
corpus = torch.multinomial(probs / probs.sum(), 40000, replacement=True)


class LSTMLM(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.embed = nn.Embedding(V, d)
        self.lstm = nn.LSTM(d, d, num_layers=2, batch_first=True)
        self.decoder = nn.Linear(d, V)

    def forward(self, x):
        h, _ = self.lstm(self.embed(x))
        return self.decoder(h)


model = LSTMLM()
opt = torch.optim.SGD(model.parameters(), lr=0.0)
PEAK, WARMUP, L2 = 40.0, 30, 0.1
for step in range(100):
    lr = PEAK * min(1.0, (step + 1) / WARMUP)
    for g in opt.param_groups:
        g["lr"] = lr
    starts = torch.randint(0, len(corpus) - T - 1, (B,))
    x = torch.stack([corpus[s:s + T] for s in starts])
    y = torch.stack([corpus[s + 1:s + T + 1] for s in starts])
    ce = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
    l2 = sum(p.pow(2).sum() for p in model.parameters())
    loss = ce + L2 * l2
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 3 == 0:
        print(f"step {step} lr {lr:.2f} ce {ce.item():.4f} l2 {l2.item():.4g}")
