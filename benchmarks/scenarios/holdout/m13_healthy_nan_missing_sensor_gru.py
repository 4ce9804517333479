# expect: {"healthy": true}
# about: held out (round 4, modern stack): written by someone who had not read the code. HEALTHY control with NaN in every batch on purpose. A GRU next-step forecaster for ragged multivariate sensor logs in which missing readings are stored as NaN (10% of values) and the batch is padded with pad_sequence(padding_value=NaN). The model turns the input into torch.nan_to_num(x, 0.0) plus an isnan() missing-indicator feature before its first Linear, and the loss keeps only valid targets by boolean indexing (pred[valid] - target[valid], valid = ~isnan(target)), so the NaN values are only ever read by isnan, nan_to_num and the index op and never reach a loss, gradient or weight (checked: those plus data-building copies are the only ops that ever see a NaN). The batch does hold NaN, but it is handled data, not a fault; the MSE falls 0.52 -> 0.085, so nothing should be reported.
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pad_sequence

torch.manual_seed(0)
torch.set_num_threads(1)

N_SENS = 6


def make_series(n):
    """ragged multivariate sensor logs; missing readings are stored as NaN (as they come from the CSV)"""
    out = []
    for _ in range(n):
        T = int(torch.randint(20, 41, (1,)))
        t = torch.arange(T, dtype=torch.float32)[:, None]
        phase = torch.rand(1, N_SENS) * 6.28
        x = torch.sin(0.3 * t + phase) + 0.1 * torch.randn(T, N_SENS)
        x[torch.rand(T, N_SENS) < 0.1] = float("nan")              # dropped readings
        out.append(x)
    return out


def collate(seqs):
    lengths = torch.tensor([len(s) for s in seqs])
    padded = pad_sequence(seqs, batch_first=True, padding_value=float("nan"))   # NaN = "no data"
    return padded, lengths


class Forecaster(nn.Module):
    """predicts the next reading of every sensor; gets the missing-value indicator as extra input"""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(2 * N_SENS, 32)
        self.gru = nn.GRU(32, 64, batch_first=True)
        self.out = nn.Linear(64, N_SENS)

    def forward(self, x):
        missing = torch.isnan(x)
        x = torch.cat([torch.nan_to_num(x, nan=0.0), missing.float()], -1)
        h, _ = self.gru(torch.relu(self.inp(x)))
        return self.out(h)


data = make_series(512)
model = Forecaster()
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
for step in range(60):
    idx = torch.randint(0, len(data), (32,))
    x, lengths = collate([data[i] for i in idx])
    pred = model(x[:, :-1])
    target = x[:, 1:]
    valid = ~torch.isnan(target)                 # drops both missing readings and the padding
    loss = (pred[valid] - target[valid]).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if step % 10 == 0 or step == 59:
        print(f"step {step:3d} mse {loss.item():.4f} (valid targets {valid.float().mean().item():.2f})")
