# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": ["", null]}
# about: held out (lr round): 2-layer tanh nn.RNN delayed-echo regression with SGD momentum 0.9 and 4-micro-batch gradient accumulation at lr=100 instead of a sane 0.01 (10^4x), the head diverges and nn.MSELoss overflows to inf at update 6.
"""Delayed-echo regression with a 2-layer tanh nn.RNN: output x[t-3] scaled by a per-sequence gain read at t=0.
SGD with momentum and gradient accumulation over 4 micro-batches."""
import argparse
import os

import torch
import torch.nn as nn

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"
DELAY = 3


def echo_batch(n, t):
    x = torch.randn(n, t, 2)
    gain = torch.rand(n, 1) * 2.0
    x[:, 0, 1] = gain[:, 0]
    x[:, 1:, 1] = 0.0
    y = torch.zeros(n, t, 1)
    y[:, DELAY:, 0] = gain * x[:, :-DELAY, 0]
    return x, y


class EchoRNN(nn.Module):
    def __init__(self, hidden=40):
        super().__init__()
        self.rnn = nn.RNN(2, hidden, num_layers=2, nonlinearity="tanh", batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=0.01 if FIXED else 100.0)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--accum", type=int, default=4)
    ap.add_argument("--updates", type=int, default=120)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=25)
    args = ap.parse_args()

    torch.manual_seed(0)
    model = EchoRNN()
    criterion = nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    for update in range(args.updates):
        opt.zero_grad()
        total = 0.0
        for _ in range(args.accum):
            x, y = echo_batch(args.micro_batch, args.seq)
            loss = criterion(model(x), y) / args.accum
            loss.backward()
            total += loss.item()
        opt.step()
        if update % 10 == 0:
            print(f"step {update} loss {total:.4f}")
    x, y = echo_batch(256, args.seq)
    with torch.no_grad():
        print(f"final loss {criterion(model(x), y).item()}")


if __name__ == "__main__":
    main()
