# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": ["aten.nll_loss_forward.default", "aten.nll_loss.default", "aten.nll_loss_nd.default", "aten.cross_entropy_loss.default"], "module": ["", null]}
# about: held out (lr round): 4-layer ReLU MLP on a 3-arm spiral with SGD momentum 0.9 + cosine schedule and nn.CrossEntropyLoss at lr=500 instead of a sane 0.05 (10^4x), logits explode and the NLL reduction overflows to inf at step 3.
"""3-arm spiral classification with a 4-layer ReLU MLP; SGD momentum with a cosine lr schedule."""
import math
import os

import torch
import torch.nn as nn

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"

BASE_LR = 0.05 if FIXED else 500.0
EPOCHS = 60


def spiral(n_per_class=200, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for c in range(classes):
        r = torch.linspace(0.05, 1.0, n_per_class)
        t = torch.linspace(c * 4.0, (c + 1) * 4.0, n_per_class) + 0.2 * torch.randn(n_per_class, generator=g)
        xs.append(torch.stack([r * torch.sin(t), r * torch.cos(t)], 1))
        ys.append(torch.full((n_per_class,), c, dtype=torch.long))
    return torch.cat(xs), torch.cat(ys)


def build(width=64):
    return nn.Sequential(
        nn.Linear(2, width), nn.ReLU(),
        nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, 3),
    )


def main():
    torch.manual_seed(0)
    x, y = spiral()
    model = build()
    crit = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR, momentum=0.9)
    batches_per_epoch = math.ceil(len(x) / 100)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS * batches_per_epoch)
    step = 0
    for epoch in range(EPOCHS):
        perm = torch.randperm(len(x))
        for i in range(0, len(x), 100):
            idx = perm[i:i + 100]
            loss = crit(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            if step % 30 == 0:
                print(f"step {step} loss {loss.item():.4f}")
            step += 1
    with torch.no_grad():
        logits = model(x)
        acc = (logits.argmax(1) == y).float().mean().item()
        print(f"train acc {acc:.3f}")
        print(f"final loss {crit(logits, y).item()}")


if __name__ == "__main__":
    main()
