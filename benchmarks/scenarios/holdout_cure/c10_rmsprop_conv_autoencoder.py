# expect: {"cause": "learning-rate-too-high", "phase": "optimizer", "op": "aten.addcmul_.default", "module": "encoder.0"}
# about: held out (cure round): strided-conv / ConvTranspose autoencoder on synthetic 16x16 textures with RMSprop (alpha 0.99, momentum 0.9) at lr=0.7 instead of a sane 2e-4 (3500x); RMSprop's ~10*lr first update makes the reconstruction ~1e12, the next gradient (~1e22) overflows the square_avg state of encoder.0 at step 1, and the MSE itself grows until it overflows to inf at step 12.
"""Convolutional autoencoder on synthetic 16x16 textures, trained with RMSprop."""
import argparse
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"


def make_textures(n=1536, size=16, seed=21):
    """Low-frequency gratings at a random orientation plus a soft blob at a random spot, values ~[0, 1]."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    theta = math.pi * torch.rand(n, 1, 1, generator=g)
    phase = 2 * math.pi * torch.rand(n, 1, 1, generator=g)
    grating = torch.sin(2 * math.pi * 1.5 * (xx * torch.cos(theta) + yy * torch.sin(theta)) + phase)
    cx, cy = 0.2 + 0.6 * torch.rand(n, 1, 1, generator=g), 0.2 + 0.6 * torch.rand(n, 1, 1, generator=g)
    blob = torch.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / 0.03)
    img = 0.5 + 0.25 * grating + 0.4 * blob + 0.03 * torch.randn(n, size, size, generator=g)
    return img.unsqueeze(1)


class ConvAE(nn.Module):
    def __init__(self, ch=16, code=32):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(1, ch, 3, stride=2, padding=1), nn.ReLU(),        # 8x8
            nn.Conv2d(ch, 2 * ch, 3, stride=2, padding=1), nn.ReLU(),   # 4x4
            nn.Flatten(), nn.Linear(2 * ch * 16, code),
        )
        self.decoder = nn.Sequential(
            nn.Linear(code, 2 * ch * 16), nn.ReLU(), nn.Unflatten(1, (2 * ch, 4, 4)),
            nn.ConvTranspose2d(2 * ch, ch, 4, stride=2, padding=1), nn.ReLU(),   # 8x8
            nn.ConvTranspose2d(ch, 1, 4, stride=2, padding=1),                   # 16x16
        )

    def forward(self, x):
        return self.decoder(self.encoder(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=2e-4 if FIXED else 0.7)
    ap.add_argument("--alpha", type=float, default=0.99)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--log-every", type=int, default=30)
    args = ap.parse_args()

    torch.manual_seed(0)
    data = make_textures()
    train, test = data[:1280], data[1280:]
    model = ConvAE()
    opt = torch.optim.RMSprop(model.parameters(), lr=args.lr, alpha=args.alpha, momentum=args.momentum)

    with torch.no_grad():
        print(f"initial test mse {F.mse_loss(model(test), test).item():.5f}")
    for step in range(args.steps):
        idx = torch.randint(0, train.shape[0], (args.batch,))
        x = train[idx]
        loss = F.mse_loss(model(x), x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.log_every == 0:
            print(f"step {step} loss {loss.item():.5f}")

    with torch.no_grad():
        final = F.mse_loss(model(test), test).item()
    print(f"final loss {final}")


if __name__ == "__main__":
    main()
