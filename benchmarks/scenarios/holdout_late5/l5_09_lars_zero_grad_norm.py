# expect: {"cause": "optimizer-state", "phase": "optimizer", "op": "aten.div.Tensor", "module": ""}
# about: held out (round late 5): trains an MLP with multi-class hinge loss and a hand-written LARS optimizer whose trust ratio is eta*||w|| / (||g|| + wd*||w||) with wd = 0; once a whole batch satisfies the margin (step 233) every gradient is exactly zero and the trust-ratio division inside optimizer.step gives Inf.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import Optimizer


class LARS(Optimizer):
    """Layer-wise adaptive rate scaling (You et al. 2017), momentum variant."""

    def __init__(self, params, lr=0.1, momentum=0.9, eta=0.02, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, eta=eta, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                w_norm = torch.linalg.vector_norm(p)
                g_norm = torch.linalg.vector_norm(g)
                trust = group["eta"] * w_norm / (g_norm + group["weight_decay"] * w_norm)
                d = g.add(p, alpha=group["weight_decay"])
                state = self.state[p]
                if "mom" not in state:
                    state["mom"] = torch.zeros_like(p)
                buf = state["mom"]
                buf.mul_(group["momentum"]).add_(d, alpha=group["lr"] * trust.item())
                p.sub_(buf)
        return None


class MarginNet(nn.Module):
    def __init__(self, d_in, d_hidden, n_cls):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_hidden), nn.ReLU())
        self.fc = nn.Linear(d_hidden, n_cls)

    def forward(self, x):
        return self.fc(self.body(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.5)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    d_in, n_cls = 16, 6
    # labels from a fixed linear "teacher"
    teacher = torch.randn(d_in, n_cls, generator=gen)
    x_all = torch.randn(20000, d_in, generator=gen)
    t_scores = (x_all @ teacher).sort(1, descending=True).values
    keep = (t_scores[:, 0] - t_scores[:, 1]) > 1.0   # drop ambiguous examples
    x_all = x_all[keep]
    y_all = (x_all @ teacher).argmax(1)

    model = MarginNet(d_in, 64, n_cls)
    opt = LARS(model.parameters(), lr=args.lr)

    for step in range(args.steps):
        idx = torch.randint(0, x_all.shape[0], (args.batch_size,), generator=gen)
        x, y = x_all[idx], y_all[idx]
        scores = model(x)
        loss = F.multi_margin_loss(scores, y, margin=1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            acc = (scores.argmax(1) == y).float().mean().item()
            print(f"step {step:4d} hinge {loss.item():.5f} acc {acc:.3f}")


if __name__ == "__main__":
    main()
