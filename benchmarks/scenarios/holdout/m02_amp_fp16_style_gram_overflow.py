# expect: {"cause": "low-precision-overflow", "phase": "forward", "op": "aten.bmm.default", "module": null}
# about: held out (round 4, modern stack): written by someone who had not read the code. Fast neural style transfer (a residual TransformerNet trained against a frozen conv feature extractor) with images in 0..255 as in the classic recipe, run under torch.autocast("cpu", dtype=torch.float16) with a GradScaler(init_scale=2**16) + unscale_ + clip_grad_norm_. The Gram matrix of the relu1 features is computed in the loss code as torch.bmm(f, f^T) / (c*h*w): autocast runs the bmm in float16, and the un-normalised sum over 576 pixels of feature products (~6e5 here; features are ~70) overflows 65504 before the division brings it back to ~60. In float32 it would be fine. So the first inf is made in the forward of step 0 by aten.bmm.default in gram(), called from the training loop outside any module (module null). The loss is inf every step; the GradScaler keeps skipping steps and shrinking its scale to 0 but cannot help, because the overflow is in the forward pass, not in the scaled gradients.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)

# images are kept in 0..255 like the classic fast-neural-style recipe
H = W = 24
N = 96
yy, xx = torch.meshgrid(torch.linspace(0, 1, H), torch.linspace(0, 1, W), indexing="ij")
content = torch.stack([
    torch.stack([xx * 255, yy * 255, (xx * yy) * 255]) * (0.5 + 0.5 * torch.rand(3, 1, 1))
    for _ in range(N)
]).clamp(0, 255)
style = (torch.sin(xx * 20) * torch.cos(yy * 20) * 0.5 + 0.5)[None].repeat(3, 1, 1)[None] * 255.0


class ConvBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1)
        self.norm = nn.InstanceNorm2d(cout, affine=True)

    def forward(self, x):
        return F.relu(self.norm(self.conv(x)))


class TransformerNet(nn.Module):
    """image -> stylised image, predicts a residual on top of the input"""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(ConvBlock(3, 16), ConvBlock(16, 32), ConvBlock(32, 16))
        self.out = nn.Conv2d(16, 3, 3, padding=1)

    def forward(self, x):
        return x + self.out(self.body(x))


class Features(nn.Module):
    """frozen random conv feature extractor (stands in for VGG relu1_2 / relu2_2)"""

    def __init__(self):
        super().__init__()
        self.slice1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
        self.slice2 = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU())

    def forward(self, x):
        a = self.slice1(x)
        b = self.slice2(a)
        return [a, b]


def gram(f):
    b, c, h, w = f.shape
    f = f.reshape(b, c, h * w)
    return torch.bmm(f, f.transpose(1, 2)) / (c * h * w)


net = TransformerNet()
feats = Features().requires_grad_(False)
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)

with torch.no_grad():
    style_grams = [gram(f) for f in feats(style)]

content_weight, style_weight = 1.0, 1e-3
for step in range(15):
    idx = torch.randint(0, N, (4,))
    x = content[idx]
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        y = net(x)
        fy, fx = feats(y), feats(x)
        c_loss = F.mse_loss(fy[1].float(), fx[1].float())
        s_loss = sum(F.mse_loss(gram(a).float(), g.expand(a.shape[0], -1, -1)) for a, g in zip(fy, style_grams))
        loss = content_weight * c_loss + style_weight * s_loss
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(net.parameters(), 5.0)
    scaler.step(opt)
    scaler.update()
    if step % 5 == 0:
        print(f"step {step:2d} content {c_loss.item():.4g} style {s_loss.item():.4g} scale {scaler.get_scale():.0f}")
print("done, last loss", loss.item())
