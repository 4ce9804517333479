# expect: {"cause": "exploding-gradients", "phase": "backward", "op": ["aten.convolution_backward.default", "aten.add.Tensor"], "module": "cell.hh"}
# about: a convolutional tanh RNN for video frames with a large recurrent kernel init; the forward stays bounded by tanh but the gradient grows with clip length, and one long clip overflows the backward (in `cell.hh`'s convolution backward, or in the sum of its weight gradient over the time steps, depending on the CPU's convolution kernels: at 360 frames some CPUs' backward stayed finite and Adam's squares overflowed instead, so the clip is 400 frames long).
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


class ConvRNNCell(nn.Module):
    def __init__(self, cin, ch):
        super().__init__()
        self.xh = nn.Conv2d(cin, ch, 3, padding=1)
        self.hh = nn.Conv2d(ch, ch, 3, padding=1)
        nn.init.normal_(self.hh.weight, 0.0, 0.5)

    def forward(self, x, h):
        return torch.tanh(self.xh(x) + self.hh(h))


class Nowcaster(nn.Module):
    def __init__(self, ch=8):
        super().__init__()
        self.ch = ch
        self.cell = ConvRNNCell(1, ch)
        self.readout = nn.Conv2d(ch, 1, 1)

    def forward(self, frames):
        h = torch.zeros(frames.shape[0], self.ch, *frames.shape[-2:])
        for t in range(frames.shape[1]):
            if FIXED and t and t % 20 == 0:
                h = h.detach()  # truncated backpropagation through time
            h = self.cell(frames[:, t], h)
        return self.readout(h)


def clips(n=30):
    g = torch.Generator().manual_seed(2)
    for i in range(n):
        length = 400 if i == 12 else int(torch.randint(6, 12, (1,), generator=g))
        frames = torch.rand(4, length + 1, 1, 8, 8, generator=g)
        yield frames[:, :-1], frames[:, -1]


model = Nowcaster()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step, (frames, target) in enumerate(clips()):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(frames), target)
    loss.backward()
    if FIXED:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=7)
    optimizer.step()
    if step % 5 == 0:
        print(f"step {step} frames {frames.shape[1]} loss {loss.item():.4f}")
print(f"final loss {loss.item():.6g}")
