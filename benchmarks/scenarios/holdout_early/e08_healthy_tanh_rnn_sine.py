# expect: {"healthy": true}
# about: held out (round early): A plain tanh nn.RNNCell with PyTorch's default initialisation is unrolled by hand over 80-step noisy sine waves and trained with Adam to predict the next sample; standard, contractive recurrence, so everything stays finite and the loss decreases.
import math
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)

# ---- synthetic signals: sines of random frequency/phase/amplitude with a little noise ----
N, T = 2048, 81
t = torch.arange(T).float()
freq = 0.05 + 0.25 * torch.rand(N, 1)
amp = 0.5 + torch.rand(N, 1)
phase = 2 * math.pi * torch.rand(N, 1)
signals = amp * torch.sin(freq * t + phase) + 0.02 * torch.randn(N, T)


class TanhRNN(nn.Module):
    def __init__(self, hid=48):
        super().__init__()
        self.cell = nn.RNNCell(1, hid, nonlinearity="tanh")
        self.out = nn.Linear(hid, 1)

    def forward(self, x):
        h = x.new_zeros(x.shape[0], self.cell.hidden_size)
        preds = []
        for i in range(x.shape[1]):
            h = self.cell(x[:, i:i + 1], h)
            preds.append(self.out(h))
        return torch.cat(preds, 1)


model = TanhRNN()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
loss_fn = nn.MSELoss()

for step in range(100):
    idx = torch.randint(0, N, (64,))
    seq = signals[idx]
    pred = model(seq[:, :-1])
    loss = loss_fn(pred, seq[:, 1:])
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 5 == 0 or step == 99:
        print(f"step {step:3d} mse {loss.item():.5f}")
