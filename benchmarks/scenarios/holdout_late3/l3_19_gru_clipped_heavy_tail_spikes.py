# expect: {"healthy": true}
# about: held out (round late 3): a GRU regressor on 80-step sequences with heavy-tailed label noise, RMSprop and gradient clipping; the loss has big spikes (up to ~66) and the pre-clip gradient norm jumps to ~52, but clipping keeps every value finite.
import argparse

import torch
import torch.nn as nn


class SensorGRU(nn.Module):
    def __init__(self, d_in=3, hidden=32):
        super().__init__()
        self.gru = nn.GRU(d_in, hidden, batch_first=True)
        self.out = nn.Sequential(nn.Linear(hidden, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        _, h = self.gru(x)
        return self.out(h[-1]).squeeze(-1)


def make_batch(batch, length, g):
    x = torch.randn(batch, length, 3, generator=g)
    decay = 0.97 ** torch.arange(length - 1, -1, -1).float()
    clean = (x[:, :, 0] * decay).sum(1) * 0.2 + torch.tanh(x[:, -5:, 1].sum(1))
    # heavy-tailed label noise (bad sensor reads): occasional huge residuals
    noise = 0.1 * torch.randn(batch, generator=g) * torch.exp(1.5 * torch.randn(batch, generator=g))
    return x, clean + noise


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--length", type=int, default=80)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    model = SensorGRU()
    opt = torch.optim.RMSprop(model.parameters(), lr=args.lr, alpha=0.9)
    crit = nn.MSELoss()

    for step in range(args.steps):
        x, y = make_batch(args.batch, args.length, g)
        loss = crit(model(x), y)
        opt.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        if step % 10 == 0 or loss.item() > 20:
            print(f"step {step:4d} loss {loss.item():9.4f} grad norm before clip {grad_norm.item():9.2f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
