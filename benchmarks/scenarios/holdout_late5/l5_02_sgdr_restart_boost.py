# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": ""}
# about: held out (round late 5): trains a 1-D conv denoising autoencoder with SGD and cosine annealing with warm restarts whose peak LR doubles at every restart (0.05, 0.1, 0.2, ...); the third cycle's peak is past the stability limit, the reconstruction blows up and the first Inf is the F.mse_loss value (computed outside the model) at step 227.
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class DenoisingAE(nn.Module):
    """1-D convolutional denoising autoencoder for short sensor windows."""

    def __init__(self, ch=16):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv1d(1, ch, 5, padding=2), nn.Tanh(),
            nn.Conv1d(ch, ch, 5, padding=2), nn.Tanh(),
        )
        self.decoder = nn.Sequential(
            nn.Conv1d(ch, ch, 5, padding=2), nn.Tanh(),
            nn.Conv1d(ch, 1, 5, padding=2),
        )

    def forward(self, x):
        return self.decoder(self.encoder(x))


def sensor_batch(n, length, gen):
    t = torch.linspace(0, 1, length)
    freq = torch.rand(n, 1, generator=gen) * 6 + 1
    phase = torch.rand(n, 1, generator=gen) * 2 * math.pi
    amp = torch.rand(n, 1, generator=gen) * 2 + 0.5
    clean = amp * torch.sin(2 * math.pi * freq * t + phase)
    noisy = clean + 0.3 * torch.randn(n, length, generator=gen)
    return noisy.unsqueeze(1), clean.unsqueeze(1)


class RestartSchedule:
    """Cosine annealing with warm restarts; every restart 'kicks' harder to escape
    the current basin (peak lr multiplied by restart_gain)."""

    def __init__(self, opt, base_lr, cycle, restart_gain, min_lr=1e-4):
        self.opt, self.base_lr, self.cycle = opt, base_lr, cycle
        self.gain, self.min_lr = restart_gain, min_lr

    def set(self, step):
        k, pos = divmod(step, self.cycle)
        peak = self.base_lr * self.gain ** k
        lr = self.min_lr + 0.5 * (peak - self.min_lr) * (1 + math.cos(math.pi * pos / self.cycle))
        for g in self.opt.param_groups:
            g["lr"] = lr
        return lr


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--cycle", type=int, default=100)
    p.add_argument("--restart-gain", type=float, default=2.0)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)

    model = DenoisingAE()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    sched = RestartSchedule(opt, args.lr, args.cycle, args.restart_gain)

    for step in range(args.steps):
        noisy, clean = sensor_batch(args.batch_size, 64, gen)
        lr = sched.set(step)
        recon = model(noisy)
        loss = F.mse_loss(recon, clean)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step:4d} lr {lr:.4f} mse {loss.item():.5f}")


if __name__ == "__main__":
    main()
