"""Semi-supervised mean-teacher on a noisy 2-D spiral: a student MLP gets cross-entropy on a few
labelled points plus a consistency KL towards an EMA teacher on augmented unlabelled points.
Latent hazard (line 28): consistency_kl() takes torch.log of both softmax outputs with no clamp; a
class probability underflowing to 0 would give -inf / NaN, but T=2 keeps the logits mild."""
import argparse
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def spiral(n_per_class, n_classes=3, noise=0.15, gen=None):
    xs, ys = [], []
    for c in range(n_classes):
        r = torch.linspace(0.1, 1.0, n_per_class)
        theta = r * 4.0 + c * 2 * math.pi / n_classes
        theta = theta + noise * torch.randn(n_per_class, generator=gen)
        xs.append(torch.stack([r * torch.cos(theta), r * torch.sin(theta)], dim=1))
        ys.append(torch.full((n_per_class,), c, dtype=torch.long))
    return torch.cat(xs), torch.cat(ys)


def consistency_kl(teacher_logits, student_logits, temperature):
    p = torch.softmax(teacher_logits / temperature, dim=-1)
    q = torch.softmax(student_logits / temperature, dim=-1)
    return (p * (torch.log(p) - torch.log(q))).sum(-1).mean()


def build_mlp():
    return nn.Sequential(
        nn.Linear(2, 64), nn.SiLU(),
        nn.Linear(64, 64), nn.SiLU(),
        nn.Linear(64, 3),
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--ema", type=float, default=0.99)
    args = ap.parse_args()

    torch.manual_seed(0)
    x, y = spiral(300)
    perm = torch.randperm(x.shape[0])
    labelled = perm[:30]
    unlabelled = perm[30:]

    student = build_mlp()
    teacher = copy.deepcopy(student)
    for p in teacher.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam(student.parameters(), lr=5e-3)

    for step in range(args.steps):
        xb_l, yb_l = x[labelled], y[labelled]
        ub = unlabelled[torch.randint(0, unlabelled.numel(), (128,))]
        xu = x[ub]
        view_s = xu + 0.05 * torch.randn_like(xu)
        view_t = xu + 0.05 * torch.randn_like(xu)

        sup = F.cross_entropy(student(xb_l), yb_l)
        ramp = min(1.0, step / 100.0)
        cons = consistency_kl(teacher(view_t), student(view_s), temperature=2.0)
        loss = sup + 2.0 * ramp * cons

        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for pt, ps in zip(teacher.parameters(), student.parameters()):
                pt.mul_(args.ema).add_(ps, alpha=1 - args.ema)

        if step % 50 == 0:
            print(f"[{step}] loss={loss.item():.4f} sup={sup.item():.4f} cons={cons.item():.5f}")
    print(f"done loss={loss.item():.4f}")


if __name__ == "__main__":
    main()
