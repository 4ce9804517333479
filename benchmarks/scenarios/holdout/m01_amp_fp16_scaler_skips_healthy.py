# expect: {"healthy": true}
# about: held out (round 4, modern stack): written by someone who had not read the code. HEALTHY control. A 1-D conv + MLP classifier for accelerometer windows trained under torch.autocast("cpu", dtype=torch.float16) with torch.amp.GradScaler("cpu", init_scale=2**24), scaler.unscale_(opt) + clip_grad_norm_ before scaler.step. With a 2**24 loss scale, the scaled gradient of the logits (~2e5 per element) overflows float16 in the very first backward passes (when it is cast back into the float16 head, then in the float16 linear/conv backward), so the gradients are inf/NaN; the scaler sees that after unscale_, skips optimizer steps at iterations 0-3 (before any optimizer step has run) and halves the scale each time (later two more skips at iterations 6 and 19), then training proceeds with a finite, falling loss. These inf gradients are the designed behaviour of dynamic loss scaling (no weight is ever touched by them), so nothing should be reported.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)

N, C, T, K = 2048, 3, 64, 4
t = torch.linspace(0, 1, T)
labels = torch.randint(0, K, (N,))
freq = (labels.float() + 1.0) * 3.0
signals = torch.sin(2 * torch.pi * freq[:, None, None] * t[None, None, :] + torch.rand(N, C, 1) * 6.28)
signals = signals + 0.3 * torch.randn(N, C, T)


class ActivityNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(C, 32, 5, padding=2)
        self.conv2 = nn.Conv1d(32, 32, 5, padding=2, stride=2)
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, K))

    def forward(self, x):
        x = F.gelu(self.conv1(x))
        x = F.gelu(self.conv2(x))
        return self.head(self.pool(x).flatten(1))


model = ActivityNet()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)

batch = 64
skipped = 0
for step in range(60):
    idx = torch.randint(0, N, (batch,))
    x, y = signals[idx], labels[idx]
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    scale_before = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    if scaler.get_scale() < scale_before:
        skipped += 1
    if step % 10 == 0 or step == 59:
        print(f"step {step:3d} loss {loss.item():.4f} grad_norm {gnorm.item():.3g} scale {scaler.get_scale():.0f} skipped {skipped}")

with torch.no_grad():
    acc = (model(signals[:512]).argmax(1) == labels[:512]).float().mean().item()
print(f"final loss {loss.item():.4f} acc {acc:.3f} skipped steps {skipped}")
