# expect: {"cause": "unsafe-op", "phase": "forward", "op": ["aten._weight_norm_interface.default", "aten._weight_norm.default", "aten.div.Tensor"], "module": ["blocks.0.conv2.parametrizations.weight.0", "blocks.0.conv2.parametrizations.weight", "blocks.0.conv2"]}
# about: held out (round 4, modern stack): written by someone who had not read the code. A HiFi-GAN-style 1-D conv speech denoiser (dilated residual blocks) that applies torch.nn.utils.parametrizations.weight_norm to every Conv1d, as such vocoders do. Before that, reset_parameters() zero-initialises the 1x1 conv2 of each residual block "so every block starts as the identity". weight_norm then stores g = ||v|| = 0 and v = 0, and every forward recomputes weight = g * v / ||v|| = 0 * 0/0 = NaN. So at step 0, in the forward, the first NaN is made when blocks.0.conv2 reads its weight: aten._weight_norm_interface.default (what torch._weight_norm dispatches to on CPU; the composite _weight_norm or the div inside it also accepted), run inside the parametrization module blocks.0.conv2.parametrizations.weight.0 (its ParametrizationList or the conv itself also accepted). The cause is a division by a zero norm (unsafe-op); the zero init is what set it up, but nothing overflowed, so it is not bad-initialization in the vocabulary's sense. The L1 loss prints nan from step 0.
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.parametrizations import weight_norm

torch.manual_seed(0)
torch.set_num_threads(1)

SR, SEG = 8000, 2048


def synth_batch(b, g):
    t = torch.arange(SEG) / SR
    f0 = 100 + 200 * torch.rand(b, 1, generator=g)
    clean = sum(torch.sin(2 * math.pi * k * f0 * t) / k for k in range(1, 5)) * 0.3
    noisy = clean + 0.1 * torch.randn(b, SEG, generator=g)
    return noisy[:, None], clean[:, None]


class ResBlock(nn.Module):
    def __init__(self, ch, dilation):
        super().__init__()
        self.conv1 = nn.Conv1d(ch, ch, 3, padding=dilation, dilation=dilation)
        self.conv2 = nn.Conv1d(ch, ch, 1)

    def forward(self, x):
        return x + self.conv2(F.leaky_relu(self.conv1(F.leaky_relu(x, 0.1)), 0.1))


class Denoiser(nn.Module):
    def __init__(self, ch=32):
        super().__init__()
        self.pre = nn.Conv1d(1, ch, 7, padding=3)
        self.blocks = nn.Sequential(*[ResBlock(ch, d) for d in (1, 3, 9)])
        self.post = nn.Conv1d(ch, 1, 7, padding=3)
        self.reset_parameters()
        self.apply_weight_norm()

    def reset_parameters(self):
        # start every residual branch at zero so each block is the identity at init
        for blk in self.blocks:
            nn.init.zeros_(blk.conv2.weight)
            nn.init.zeros_(blk.conv2.bias)

    def apply_weight_norm(self):
        for m in self.modules():
            if isinstance(m, nn.Conv1d):
                weight_norm(m)

    def forward(self, x):
        return x + torch.tanh(self.post(F.leaky_relu(self.blocks(self.pre(x)), 0.1)))


model = Denoiser()
opt = torch.optim.Adam(model.parameters(), lr=2e-4, betas=(0.8, 0.99))
g = torch.Generator().manual_seed(1)
for step in range(30):
    noisy, clean = synth_batch(8, g)
    out = model(noisy)
    loss = F.l1_loss(out, clean)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 5 == 0:
        print(f"step {step:3d} l1 {loss.item():.5f}")
print("final", loss.item())
