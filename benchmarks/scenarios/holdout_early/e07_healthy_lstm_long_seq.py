# expect: {"healthy": true}
# about: held out (round early): An LSTMCell is stepped by hand over 256-step noisy oscillation traces to classify their frequency band (a running prediction at every step), trained with Adam and gradient-norm clipping; long but gated recurrence, every value stays finite and the loss falls.
import math
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)

# ---- synthetic accelerometer traces: 4 classes of dominant frequency, heavy noise, 256 samples each ----
N, T, C = 1024, 256, 4
labels = torch.randint(0, C, (N,))
freqs = torch.tensor([0.03, 0.06, 0.10, 0.15])[labels]
t = torch.arange(T).float()
phase = 2 * math.pi * torch.rand(N, 1)
x = torch.sin(2 * math.pi * freqs[:, None] * t[None] + phase) + 0.5 * torch.randn(N, T)
x = torch.stack([x, 0.5 * torch.randn(N, T)], -1)          # second channel: uninformative sensor


class LongLSTM(nn.Module):
    def __init__(self, d=2, hid=64):
        super().__init__()
        self.cell = nn.LSTMCell(d, hid)
        self.head = nn.Linear(hid, C)
        with torch.no_grad():                              # forget-gate bias of 1, as usually recommended
            self.cell.bias_ih[hid:2 * hid].fill_(1.0)
            self.cell.bias_hh[hid:2 * hid].zero_()

    def forward(self, seq):
        h = seq.new_zeros(seq.shape[0], self.cell.hidden_size)
        c = torch.zeros_like(h)
        logits = []
        for i in range(seq.shape[1]):
            h, c = self.cell(seq[:, i], (h, c))
            logits.append(self.head(h))                    # running prediction at every time step
        return torch.stack(logits, 1)


model = LongLSTM()
opt = torch.optim.Adam(model.parameters(), lr=3e-3)

step = 0
for epoch in range(2):
    perm = torch.randperm(N)
    for i in range(0, N, 32):
        idx = perm[i:i + 32]
        logits = model(x[idx])[:, 16:]                     # ignore the first 16 warm-up steps
        y = labels[idx][:, None].expand(-1, logits.shape[1])
        loss = F.cross_entropy(logits.reshape(-1, C), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        acc = (logits[:, -1].argmax(1) == labels[idx]).float().mean()
        print(f"epoch {epoch} step {step:3d} loss {loss.item():.4f} acc {acc.item():.2f} grad-norm {gnorm.item():.3f}")
        step += 1
