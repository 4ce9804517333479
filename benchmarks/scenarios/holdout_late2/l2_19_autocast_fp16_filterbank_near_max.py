# expect: {"healthy": true}
# about: held out (round late 2): audio-event classifier on raw int16-scale waveforms under CPU float16 autocast, with a frozen Conv1d filterbank front end whose outputs peak around 4.8e4, close to but below the float16 max of 65504; log compression keeps everything after it small, and no value ever overflows.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=250)
parser.add_argument("--lr", type=float, default=2e-3)
args = parser.parse_args()

torch.manual_seed(19)

SR, LEN = 8000, 1024
FULL_SCALE = 32767.0  # int16 PCM


def make_clips(bs):
    """3 classes: steady tone, noise burst, rising chirp; loud recordings near full scale."""
    y = torch.randint(0, 3, (bs,))
    t = torch.arange(LEN) / SR
    f0 = 300 + 1500 * torch.rand(bs, 1)
    tone = torch.sin(2 * math.pi * f0 * t)
    noise = torch.randn(bs, LEN).clamp(-3, 3) / 3
    chirp = torch.sin(2 * math.pi * (f0 * t + 4000 * t ** 2))
    wave = torch.where(y[:, None] == 0, tone, torch.where(y[:, None] == 1, noise, chirp))
    gain = 0.6 + 0.35 * torch.rand(bs, 1)
    return (FULL_SCALE * gain * wave).round().unsqueeze(1), y


def gabor_filterbank(n_filters=24, width=64):
    t = torch.arange(width) - width / 2
    freqs = torch.linspace(200, 3600, n_filters)[:, None]
    window = torch.hann_window(width)
    bank = window * torch.cos(2 * math.pi * freqs * t / SR)
    return bank / bank.abs().sum(1, keepdim=True) * 1.8  # per-filter gain


class AudioNet(nn.Module):
    def __init__(self, n_filters=24, n_cls=3):
        super().__init__()
        self.frontend = nn.Conv1d(1, n_filters, 64, stride=16, bias=False)
        with torch.no_grad():
            self.frontend.weight.copy_(gabor_filterbank(n_filters).unsqueeze(1))
        self.frontend.weight.requires_grad_(False)  # fixed filterbank
        self.body = nn.Sequential(
            nn.Conv1d(n_filters, 32, 5, padding=2), nn.ReLU(),
            nn.Conv1d(32, 32, 5, padding=2), nn.ReLU(),
        )
        self.head = nn.Linear(32, n_cls)

    def forward(self, wave):
        fb = self.frontend(wave)
        feats = torch.log1p(fb.abs())
        h = self.body(feats)
        return self.head(h.mean(-1)), fb


model = AudioNet()
opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=args.lr)

peak = 0.0
for step in range(args.steps):
    wave, y = make_clips(32)
    with torch.autocast("cpu", dtype=torch.float16):
        logits, fb = model(wave)
        loss = F.cross_entropy(logits.float(), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    peak = max(peak, fb.abs().max().item())
    if step % 25 == 0:
        acc = (logits.argmax(1) == y).float().mean().item()
        print(f"step {step:4d}  loss {loss.item():.4f}  acc {acc:.2f}  filterbank peak {peak:.0f} (fp16 max 65504)")

print(f"final loss {loss.item():.4f}")
