# expect: {"cause": "unsafe-op", "phase": "backward", "op": "aten.exp.default", "module": "pool"}
# about: held out (round late 2): Multiple-instance regressor whose custom LogSumExp pooling Function has a stable forward but a naive backward exp(s) / sum(exp(s)); instance scores drift up toward the lesion sizes in mm and the backward exp overflows to inf (then inf/inf = NaN) at step 55.
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--lr", type=float, default=2e-3)
args = parser.parse_args()

torch.manual_seed(11)


class LogSumExpPool(torch.autograd.Function):
    """Smooth-max pooling over the instance axis (dim=1)."""

    @staticmethod
    def forward(ctx, scores):
        m = scores.max(dim=1, keepdim=True).values
        out = m + torch.log(torch.exp(scores - m).sum(dim=1, keepdim=True))
        ctx.save_for_backward(scores)
        return out.squeeze(1)

    @staticmethod
    def backward(ctx, grad_out):
        (scores,) = ctx.saved_tensors
        w = torch.exp(scores)
        return grad_out[:, None] * w / w.sum(dim=1, keepdim=True)


class LSEPool(nn.Module):
    def forward(self, s):
        return LogSumExpPool.apply(s)


# multiple-instance regression: each bag = 12 tissue patches (24 features each);
# bag label = largest lesion diameter (mm) among its patches
N_BAGS, K, F = 1500, 12, 24
proj = torch.randn(F)
patches = torch.randn(N_BAGS, K, F)
size_per_patch = (patches @ proj).clamp(min=0) * 30.0
bag_target = size_per_patch.max(dim=1).values + 5.0


class MILRegressor(nn.Module):
    def __init__(self, f=F, hidden=64):
        super().__init__()
        self.instance = nn.Sequential(nn.Linear(f, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.pool = LSEPool()

    def forward(self, bags):
        s = self.instance(bags).squeeze(-1)  # (B, K) instance scores
        return self.pool(s)


model = MILRegressor()
opt = torch.optim.Adam(model.parameters(), lr=args.lr)

bs = 32
for step in range(args.steps):
    idx = torch.randint(0, N_BAGS, (bs,))
    pred = model(patches[idx])
    loss = nn.functional.smooth_l1_loss(pred, bag_target[idx], beta=5.0)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 25 == 0:
        print(f"step {step:4d}  loss {loss.item():.3f}  mean pred {pred.mean().item():.1f} mm  (target {bag_target[idx].mean().item():.1f} mm)")

print(f"final loss {loss.item():.4f}")
