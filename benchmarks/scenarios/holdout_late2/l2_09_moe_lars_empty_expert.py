# expect: {"cause": "optimizer-state", "phase": "optimizer", "op": "aten.div.Tensor", "module": ""}
# about: held out (round late 2): Top-1 mixture-of-experts classifier trained with a hand-written LARS optimizer (trust ratio ||w|| / ||g||, no eps); routing gradually collapses until an expert receives no tokens, its gradient is exactly zero, and the trust ratio divides by 0 (inf, then NaN weights) at step 97.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--experts", type=int, default=4)
args = parser.parse_args()

torch.manual_seed(9)


class LARS(torch.optim.Optimizer):
    """Layer-wise adaptive rate scaling: every tensor moves by lr * ||w|| / ||g|| * g."""

    def __init__(self, params, lr=0.01, momentum=0.9):
        super().__init__(params, dict(lr=lr, momentum=momentum))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                trust = p.norm() / g.norm()
                update = trust * g
                buf = self.state[p].get("momentum_buffer")
                if buf is None:
                    buf = self.state[p]["momentum_buffer"] = update.clone()
                else:
                    buf.mul_(group["momentum"]).add_(update)
                p.add_(buf, alpha=-group["lr"])


class Expert(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class MoELayer(nn.Module):
    def __init__(self, d, h, n_experts):
        super().__init__()
        self.gate = nn.Linear(d, n_experts)
        self.experts = nn.ModuleList([Expert(d, h) for _ in range(n_experts)])

    def forward(self, x):
        probs = F.softmax(self.gate(x), dim=-1)
        weight, choice = probs.max(dim=-1)  # top-1 routing
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            sel = choice == e
            out[sel] = weight[sel, None] * expert(x[sel])
        return out


class MoEClassifier(nn.Module):
    def __init__(self, d_in=16, d=32, n_cls=6, n_experts=4):
        super().__init__()
        self.embed = nn.Linear(d_in, d)
        self.moe = MoELayer(d, 64, n_experts)
        self.head = nn.Linear(d, n_cls)

    def forward(self, x):
        h = self.embed(x)
        h = h + self.moe(h)
        return self.head(h)


# synthetic data: 6 classes, each a gaussian blob in 16-d
n_cls, d_in = 6, 16
means = torch.randn(n_cls, d_in) * 2


def batch(bs=64):
    y = torch.randint(0, n_cls, (bs,))
    return means[y] + torch.randn(bs, d_in), y


model = MoEClassifier(n_experts=args.experts)
opt = LARS(model.parameters(), lr=args.lr)

for step in range(args.steps):
    x, y = batch()
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 25 == 0:
        with torch.no_grad():
            load = torch.bincount(model.moe.gate(model.embed(x)).argmax(-1), minlength=args.experts)
        print(f"step {step:4d}  loss {loss.item():.4f}  expert load {load.tolist()}")

print(f"final loss {loss.item():.4f}")
