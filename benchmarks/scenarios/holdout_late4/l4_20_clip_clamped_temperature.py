# expect: {"healthy": true}
# about: held out (round late 4): a CLIP-style dual encoder with a learnable log temperature trained with a high lr, so the logit scale climbs steadily to its clamp at 100 and logits approach +-100 while the loss bounces, but the clamp keeps everything finite.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Tower(nn.Module):
    def __init__(self, d_in, d_emb, hidden=96):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, d_emb))

    def forward(self, x):
        return F.normalize(self.net(x), dim=-1, eps=1e-6)


class DualEncoder(nn.Module):
    def __init__(self, d_img, d_txt, d_emb=32):
        super().__init__()
        self.image = Tower(d_img, d_emb)
        self.text = Tower(d_txt, d_emb)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, img, txt):
        zi, zt = self.image(img), self.text(txt)
        scale = self.logit_scale.exp()
        return scale * zi @ zt.t(), scale


def make_pairs(n, gen, d_latent=8, d_img=48, d_txt=24):
    z = torch.randn(n, d_latent, generator=gen)
    a = torch.randn(d_latent, d_img, generator=gen)
    b = torch.randn(d_latent, d_txt, generator=gen)
    img = torch.tanh(z @ a) + 0.1 * torch.randn(n, d_img, generator=gen)
    txt = z @ b + 0.1 * torch.randn(n, d_txt, generator=gen)
    return img, txt


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=700)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--scale-lr", type=float, default=5e-2)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    img, txt = make_pairs(8000, gen)
    model = DualEncoder(img.shape[1], txt.shape[1])
    towers = [p_ for n, p_ in model.named_parameters() if n != "logit_scale"]
    opt = torch.optim.Adam([{"params": towers}, {"params": [model.logit_scale], "lr": args.scale_lr}], lr=args.lr)
    batch_gen = torch.Generator().manual_seed(1)
    labels = torch.arange(args.batch_size)
    for step in range(args.steps):
        idx = torch.randint(0, len(img), (args.batch_size,), generator=batch_gen)
        logits, scale = model(img[idx], txt[idx])
        loss = 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100.0))  # as in CLIP: temperature never below 0.01
        if step % 50 == 0:
            print(f"step {step:4d} loss {loss.item():.4f} logit scale {scale.item():7.2f} "
                  f"max |logit| {logits.abs().max().item():7.2f}")


if __name__ == "__main__":
    main()
