# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": ["aten.addmm.default", "aten.mse_loss.default"], "module": ["dec", ""]}
# label widened after the first run: the decoder's addmm makes the first +Inf at step 20 (an independent dispatch-mode check), but the GRU's gates take it to finite values (sigmoid/tanh of inf); the loss's inputs stay finite (max 1.6e18) and mse_loss's sum overflows at the same step: that is what reaches the loss
# about: held out (round early): A GRUCell encoder-decoder forecaster (decoder fed its own previous prediction) is trained with SGD, momentum 0.9 and lr=1.0, far too high; the loss oscillates and climbs from about step 7, the fed-back predictions grow geometrically, and at step 20 the decoder's input projection overflows to inf (loss inf, nan from step 24).
import math
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)

# ---- synthetic multi-sensor load curves: sums of sinusoids with random phase + noise ----
N, T_IN, T_OUT, D = 512, 32, 24, 3
t = torch.arange(T_IN + T_OUT).float()
freq = 0.1 + 0.3 * torch.rand(N, 1, D)
phase = 2 * math.pi * torch.rand(N, 1, D)
amp = 1 + 2 * torch.rand(N, 1, D)
series = amp * torch.sin(freq * t[None, :, None] + phase) + 0.5 * torch.sin(0.05 * t[None, :, None])
series = series + 0.05 * torch.randn_like(series)
src, tgt = series[:, :T_IN], series[:, T_IN:]


class Seq2Seq(nn.Module):
    def __init__(self, d=D, hid=64):
        super().__init__()
        self.enc = nn.GRUCell(d, hid)
        self.dec = nn.GRUCell(d, hid)
        self.out = nn.Linear(hid, d)

    def forward(self, x, n_out):
        h = x.new_zeros(x.shape[0], self.enc.hidden_size)
        for i in range(x.shape[1]):
            h = self.enc(x[:, i], h)
        y = x[:, -1]
        outs = []
        for i in range(n_out):                 # decoder is fed its own previous prediction
            h = self.dec(y, h)
            y = self.out(h)
            outs.append(y)
        return torch.stack(outs, 1)


model = Seq2Seq()
opt = torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
loss_fn = nn.MSELoss()

step = 0
for epoch in range(8):
    perm = torch.randperm(N)
    for i in range(0, N, 64):
        idx = perm[i:i + 64]
        pred = model(src[idx], T_OUT)
        loss = loss_fn(pred, tgt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch {epoch} step {step:3d} loss {loss.item():.4f}")
        step += 1
