"""Train a GRU to predict the running sum of a noisy variable-length signal, with a per-sequence masked MSE.
Latent hazard (line 46): (sq_err * mask).sum(1) / mask.sum(1) -- divides by each sequence's length, which is
0/0 = NaN for an empty (all-padding) sequence; lengths are drawn from randint(1, T + 1), so every row has at
least one valid step and it has not fired yet.
"""
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()

torch.manual_seed(0)

n, max_len = 1024, 16
signal = torch.randn(n, max_len, 1)
lengths = torch.randint(1, max_len + 1, (n,))
valid = (torch.arange(max_len)[None, :] < lengths[:, None]).float()
signal = signal * valid[..., None]
target = 0.3 * signal.cumsum(1).squeeze(-1)


class RunningSumRNN(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.rnn = nn.GRU(1, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        h, _ = self.rnn(x)
        return self.out(h).squeeze(-1)


model = RunningSumRNN()
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

for step in range(args.steps):
    idx = torch.randint(0, n, (args.batch_size,))
    x, y, mask = signal[idx], target[idx], valid[idx]
    pred = model(x)
    sq_err = (pred - y) ** 2
    per_seq = (sq_err * mask).sum(1) / mask.sum(1)
    loss = per_seq.mean()

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    if step % 50 == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}")
