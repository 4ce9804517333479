# expect: {"cause": "unsafe-op", "phase": "backward", "op": ["aten.div.Tensor", "aten.sqrt.default"], "module": ["mbstd", "netD.mbstd"]}
# about: held out (round 4, modern stack): written by someone who had not read the code. A small conv GAN (ConvTranspose generator, conv discriminator) with two Adam optimizers (optD, optG) and the non-saturating logistic loss, on synthetic 16x16 glyphs in [-1, 1] whose 4-pixel border is exactly -1 in every real image. The discriminator has a hand-written ProGAN/StyleGAN minibatch-stddev layer (netD.mbstd) computing the std over the group as sqrt(mean((x - mean)^2)) without the usual + 1e-8. After the first stride-2 conv, the outer feature positions only see the constant border, so for the real batch their variance over the group is exactly 0: sqrt(0) = 0 is fine in the forward, but in the backward of lossD at step 0, SqrtBackward (grad / (2 * result)) gives inf via aten.div.Tensor, and the chain then makes NaN gradients (0 * inf) and NaN D weights after optD.step. The label is that backward division (the forward op whose gradient it is, aten.sqrt.default, also accepted), in the minibatch-std module: "mbstd" as netD.named_modules() names it ("netD.mbstd" if the two nets are named by variable). lossD prints 1.41 and lossG already nan at step 0.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)

Z, S = 32, 16


def real_batch(b):
    """16x16 'glyphs' in [-1, 1]: random strokes inside the central 8x8, background exactly -1."""
    img = torch.full((b, 1, S, S), -1.0)
    core = torch.rand(b, 1, 8, 8)
    strokes = (core > 0.6).float() * 2 - 1
    strokes = F.avg_pool2d(F.pad(strokes, (1, 1, 1, 1), value=-1.0), 3, stride=1)
    img[:, :, 4:12, 4:12] = strokes
    return img


class MinibatchStd(nn.Module):
    """ProGAN/StyleGAN minibatch standard deviation: append the mean per-pixel std over the batch group."""

    def __init__(self, group=4):
        super().__init__()
        self.group = group

    def forward(self, x):
        b, c, h, w = x.shape
        g = min(self.group, b)
        y = x.reshape(g, -1, c, h, w)
        y = y - y.mean(0)
        y = y.square().mean(0).sqrt()              # std over the group
        y = y.mean(dim=(1, 2, 3))                  # one number per group member slot
        y = y.reshape(-1, 1, 1, 1).repeat(g, 1, h, w)
        return torch.cat([x, y], 1)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.from_rgb = nn.Conv2d(1, 32, 1)
        self.down1 = nn.Conv2d(32, 32, 3, stride=2, padding=1)       # 16 -> 8
        self.mbstd = MinibatchStd()
        self.down2 = nn.Conv2d(33, 64, 3, stride=2, padding=1)       # 8 -> 4
        self.head = nn.Linear(64 * 16, 1)

    def forward(self, x):
        x = F.leaky_relu(self.from_rgb(x), 0.2)
        x = F.leaky_relu(self.down1(x), 0.2)
        x = self.mbstd(x)
        x = F.leaky_relu(self.down2(x), 0.2)
        return self.head(x.flatten(1))


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(Z, 64 * 4 * 4)
        self.up1 = nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1)  # 4 -> 8
        self.up2 = nn.ConvTranspose2d(32, 16, 4, stride=2, padding=1)  # 8 -> 16
        self.to_rgb = nn.Conv2d(16, 1, 3, padding=1)

    def forward(self, z):
        x = F.leaky_relu(self.fc(z).view(-1, 64, 4, 4), 0.2)
        x = F.leaky_relu(self.up1(x), 0.2)
        x = F.leaky_relu(self.up2(x), 0.2)
        return torch.tanh(self.to_rgb(x))


netG, netD = Generator(), Discriminator()
optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.0, 0.99))
optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.0, 0.99))

for step in range(40):
    real = real_batch(32)
    z = torch.randn(32, Z)
    # --- discriminator: non-saturating logistic loss ---
    fake = netG(z)
    lossD = F.softplus(-netD(real)).mean() + F.softplus(netD(fake.detach())).mean()
    optD.zero_grad()
    lossD.backward()
    optD.step()
    # --- generator ---
    lossG = F.softplus(-netD(fake)).mean()
    optG.zero_grad()
    lossG.backward()
    optG.step()
    if step % 5 == 0:
        print(f"step {step:3d} lossD {lossD.item():.4f} lossG {lossG.item():.4f}")
