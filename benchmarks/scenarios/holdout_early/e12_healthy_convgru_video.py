# expect: {"healthy": true}
# about: held out (round early): A convolutional GRU cell is stepped by hand over 10-frame clips of bouncing squares to predict the next frame (frame-wise BCE), trained with Adam; the gated conv recurrence stays finite throughout and the loss decreases.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)

# ---- synthetic video: 2 bright squares bouncing inside a 20x20 frame ----
N, T, S, SQ = 256, 11, 20, 4


def make_clips(n):
    clips = torch.zeros(n, T, 1, S, S)
    for obj in range(2):
        pos = torch.rand(n, 2) * (S - SQ)
        vel = (torch.rand(n, 2) - 0.5) * 3
        for t in range(T):
            p = pos.round().long()
            for i in range(n):
                clips[i, t, 0, p[i, 0]:p[i, 0] + SQ, p[i, 1]:p[i, 1] + SQ] = 1.0
            pos = pos + vel
            hit_lo, hit_hi = pos < 0, pos > S - SQ
            vel = torch.where(hit_lo | hit_hi, -vel, vel)
            pos = pos.clamp(0, S - SQ)
    return clips


clips = make_clips(N)


class ConvGRUCell(nn.Module):
    def __init__(self, cin, ch, k=3):
        super().__init__()
        self.gates = nn.Conv2d(cin + ch, 2 * ch, k, padding=k // 2)
        self.cand = nn.Conv2d(cin + ch, ch, k, padding=k // 2)

    def forward(self, x, h):
        z, r = torch.sigmoid(self.gates(torch.cat([x, h], 1))).chunk(2, 1)
        n = torch.tanh(self.cand(torch.cat([x, r * h], 1)))
        return (1 - z) * h + z * n


class NextFrame(nn.Module):
    def __init__(self, ch=16):
        super().__init__()
        self.enc = nn.Conv2d(1, 8, 3, padding=1)
        self.cell = ConvGRUCell(8, ch)
        self.dec = nn.Conv2d(ch, 1, 3, padding=1)

    def forward(self, frames):
        B, L = frames.shape[:2]
        h = frames.new_zeros(B, self.cell.cand.out_channels, S, S)
        outs = []
        for t in range(L):
            h = self.cell(F.relu(self.enc(frames[:, t])), h)
            outs.append(self.dec(h))
        return torch.stack(outs, 1)


model = NextFrame()
opt = torch.optim.Adam(model.parameters(), lr=3e-3)

step = 0
for epoch in range(4):
    perm = torch.randperm(N)
    for i in range(0, N, 16):
        clip = clips[perm[i:i + 16]]
        logits = model(clip[:, :-1])
        loss = F.binary_cross_entropy_with_logits(logits, clip[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 4 == 0:
            print(f"epoch {epoch} step {step:3d} bce {loss.item():.4f}")
        step += 1
print(f"final step {step - 1} bce {loss.item():.4f}")
