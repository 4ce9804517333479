# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": ""}
# about: held out (round late 2): Conv1d FIR channel equalizer trained with SGD+momentum 0.9 at lr 0.64, just above the heavy-ball stability limit; the loss grows geometrically (roughly x1.4 per step) from the start instead of settling, and the MSE loss first overflows to inf at step 225.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--lr", type=float, default=0.64)
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--taps", type=int, default=31)
args = parser.parse_args()

torch.manual_seed(2)

# unknown multipath channel the equalizer has to invert
channel = torch.tensor([0.3, 1.0, 0.6, -0.25, 0.1]).view(1, 1, -1)


def make_batch(bs=16, length=512, snr_db=20.0):
    symbols = torch.randint(0, 2, (bs, 1, length)).float() * 2 - 1  # BPSK
    rx = F.conv1d(symbols, channel, padding=channel.shape[-1] // 2)
    noise_std = rx.std() * 10 ** (-snr_db / 20)
    rx = rx + noise_std * torch.randn_like(rx)
    return rx, symbols


class Equalizer(nn.Module):
    """Linear FIR equalizer (adaptive filter) implemented as a Conv1d."""

    def __init__(self, taps):
        super().__init__()
        self.fir = nn.Conv1d(1, 1, taps, padding=taps // 2, bias=True)
        nn.init.zeros_(self.fir.weight)
        with torch.no_grad():
            self.fir.weight[0, 0, taps // 2] = 1.0

    def forward(self, rx):
        return self.fir(rx)


model = Equalizer(args.taps)
opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

for step in range(args.steps):
    rx, sym = make_batch()
    est = model(rx)
    loss = F.mse_loss(est, sym)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 25 == 0:
        with torch.no_grad():
            ser = (est.sign() != sym).float().mean().item()
        print(f"step {step:4d}  mse {loss.item():.5f}  symbol-error-rate {ser:.4f}")

print(f"final loss {loss.item():.5f}")
