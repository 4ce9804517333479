# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.sqrt.default", "module": ["scale", "_orig_mod.scale"]}
# about: held out: written after the suite by someone who had not read it. A denoiser whose output layer scales by a learned "gain", parameterised as the square
# A denoiser whose output layer scales by a learned "gain", parameterised as the square
# root of a learned variance (no softplus, no clamp). The model is torch.compile'd.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class LearnedScale(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.var = nn.Parameter(torch.full((d,), 0.05))

    def forward(self, x):
        return x * torch.sqrt(self.var)


class Denoiser(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(d, 64), nn.SiLU(), nn.Linear(64, d))
        self.scale = LearnedScale(d)

    def forward(self, x):
        return self.scale(self.enc(x))


clean = torch.randn(256, 32) * 0.05            # targets are tiny: the gain wants to go to 0
model = Denoiser()
cmodel = torch.compile(model)
opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
for step in range(60):
    noisy = clean + torch.randn_like(clean)
    loss = F.mse_loss(cmodel(noisy), clean)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 2 == 0:
        print(f"step {step} loss {loss.item():.5f} min var {model.scale.var.min().item():.4f}")
