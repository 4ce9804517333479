# expect: {"cause": "unsafe-op", "phase": "backward", "op": "aten.div.Tensor", "module": "head"}
# about: held out (round late 5): trains a semi-supervised MLP with entropy minimisation (two forward passes, one backward per step) whose head returns log-probabilities through a custom ClampedLog Function (forward clamps at 1e-12, backward is g / p on the unclamped p); as predictions sharpen a softmax probability underflows to exactly 0 and at step 43 the backward of head divides by 0, giving Inf.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class ClampedLog(torch.autograd.Function):
    """log that never returns -inf: clamp the probability from below."""

    @staticmethod
    def forward(ctx, p):
        ctx.save_for_backward(p)
        return p.clamp_min(1e-12).log()

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        return g / p


class LogProbHead(nn.Module):
    def __init__(self, d_in, n_cls):
        super().__init__()
        self.fc = nn.Linear(d_in, n_cls)

    def forward(self, h):
        probs = torch.softmax(self.fc(h), dim=-1)
        return ClampedLog.apply(probs)


class SemiSupervisedNet(nn.Module):
    def __init__(self, d_in, d_hidden, n_cls):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_hidden), nn.ReLU())
        self.head = LogProbHead(d_hidden, n_cls)

    def forward(self, x):
        return self.head(self.backbone(x))


def two_moons_like(n, d, n_cls, gen):
    centers = torch.randn(n_cls, d, generator=gen) * 1.5
    y = torch.randint(0, n_cls, (n,), generator=gen)
    x = centers[y] + 0.7 * torch.randn(n, d, generator=gen)
    return x, y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--n-labeled", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1.3e-2)
    p.add_argument("--ent-weight", type=float, default=0.5)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x_all, y_all = two_moons_like(8000, 10, 5, gen)
    x_lab, y_lab = x_all[: args.n_labeled], y_all[: args.n_labeled]
    x_unl = x_all[args.n_labeled:]

    model = SemiSupervisedNet(10, 64, 5)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    for step in range(args.steps):
        idx = torch.randint(0, x_unl.shape[0], (args.batch_size,), generator=gen)
        logp_lab = model(x_lab)
        logp_unl = model(x_unl[idx])
        sup = F.nll_loss(logp_lab, y_lab)
        entropy = -(logp_unl.exp() * logp_unl).sum(1).mean()      # entropy minimisation
        loss = sup + args.ent_weight * entropy
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0:
            with torch.no_grad():
                acc = (model(x_unl[:2000]).argmax(1) == y_all[args.n_labeled:args.n_labeled + 2000]).float().mean()
            print(f"step {step:4d} sup {sup.item():.4f} entropy {entropy.item():.4f} unlabeled acc {acc.item():.3f}")


if __name__ == "__main__":
    main()
