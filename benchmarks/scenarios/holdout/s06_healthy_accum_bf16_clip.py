# expect: {"healthy": true}
# about: held out: written after the suite by someone who had not read it. Healthy: CNN classifier, gradient accumulation over 4 micro-batches, bfloat16 autocast on
# Healthy: CNN classifier, gradient accumulation over 4 micro-batches, bfloat16 autocast on
# CPU, clip_grad_norm_ before the step, OneCycle LR. Must produce no finding.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
X = torch.randn(512, 3, 16, 16)
y = (X[:, 0].mean((1, 2)) > 0).long() + 2 * (X[:, 1].mean((1, 2)) > 0).long()

model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    nn.Flatten(), nn.Dropout(0.1), nn.Linear(32, 4))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
ACCUM = 4
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=2 * 512 // (32 * ACCUM))
step = 0
for epoch in range(2):
    perm = torch.randperm(512)
    for i, j in enumerate(range(0, 512, 32)):
        idx = perm[j:j + 32]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(X[idx])
            loss = F.cross_entropy(logits, y[idx]) / ACCUM
        loss.backward()
        if (i + 1) % ACCUM == 0:
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            print(f"step {step} loss {loss.item() * ACCUM:.4f} grad_norm {gn.item():.4f} lr {sched.get_last_lr()[0]:.5f}")
            step += 1
