# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.log.default", "module": null}
# about: held out (round early): An LSTMCell fault detector over vibration traces uses a hand-written BCE -(y*log(p) + (1-y)*log(1-p)); once the model is confident the float32 sigmoid saturates to exactly 1.0 (or 0.0), so at step 39 a log of 0 gives -inf and 0*(-inf) makes the loss NaN.
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)

# ---- synthetic vibration traces: faulty machines show a growing high-frequency component ----
N, T, D = 1024, 40, 4
t = torch.arange(T).float()
labels = (torch.rand(N) < 0.5).float()
base = torch.sin(0.2 * t[None, :, None] + 6.28 * torch.rand(N, 1, D))
fault = labels[:, None, None] * (t[None, :, None] / T) * torch.sin(2.5 * t[None, :, None]) * 1.0
traces = base + fault + 0.3 * torch.randn(N, T, D)


class FaultDetector(nn.Module):
    def __init__(self, d=D, hid=48):
        super().__init__()
        self.cell = nn.LSTMCell(d, hid)
        self.head = nn.Linear(hid, 1)

    def forward(self, x):
        h = x.new_zeros(x.shape[0], self.cell.hidden_size)
        c = torch.zeros_like(h)
        pooled = torch.zeros_like(h)
        for i in range(x.shape[1]):
            h, c = self.cell(x[:, i], (h, c))
            pooled = pooled + h                            # accumulate evidence over the trace
        return torch.sigmoid(self.head(pooled)).squeeze(1)     # probability of a fault


model = FaultDetector()
opt = torch.optim.Adam(model.parameters(), lr=0.01)

step = 0
for epoch in range(6):
    perm = torch.randperm(N)
    for i in range(0, N, 64):
        idx = perm[i:i + 64]
        p = model(traces[idx])
        y = labels[idx]
        # binary cross-entropy written out by hand
        loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        acc = ((p > 0.5).float() == y).float().mean()
        print(f"epoch {epoch} step {step:3d} loss {loss.item():.4f} acc {acc.item():.2f}")
        step += 1
