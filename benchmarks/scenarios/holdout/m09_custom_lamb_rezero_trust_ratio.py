# expect: {"cause": "optimizer-state", "phase": "optimizer", "op": ["Lamb.step", "aten.div.Tensor"], "module": [null, "blocks.0.attn"]}
# about: held out (round 4, modern stack): written by someone who had not read the code. A ReZero Transformer (no LayerNorm; each residual branch is x + alpha * f(x) with alpha initialised to 0) for a toy token-counting task, trained with a hand-written LAMB optimizer subclassing torch.optim.Optimizer. Its step computes trust_ratio = ||w|| / ||update|| without the usual guard for zero norms. At step 0 alpha = 0, so every parameter inside the attention/FF branches gets an exactly-zero (finite) gradient; nn.MultiheadAttention initialises in_proj_bias (and out_proj.bias) to zeros, so for blocks.0.attn.in_proj_bias both ||w|| = 0 and ||update|| = ||m_hat/(sqrt(v_hat)+eps) + wd*w|| = 0, and aten.div.Tensor gives 0/0 = NaN inside Lamb.step; p.add_(update * NaN) then makes that bias NaN. Gradients were finite, the optimizer's own arithmetic made the weights non-finite: optimizer-state, phase optimizer, op Lamb.step or the aten.div.Tensor inside it, module null (optimizer code) or blocks.0.attn (owner of the parameter). Loss prints 1.136 at step 0, NaN from step 1 on.
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import Optimizer

torch.manual_seed(0)
torch.set_num_threads(1)


class Lamb(Optimizer):
    """LAMB (You et al. 2019): Adam direction, rescaled per tensor by the trust ratio ||w|| / ||update||."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                m_hat = exp_avg / (1 - beta1 ** state["step"])
                v_hat = exp_avg_sq / (1 - beta2 ** state["step"])
                update = m_hat / (v_hat.sqrt() + group["eps"]) + group["weight_decay"] * p
                w_norm = p.norm(2)
                u_norm = update.norm(2)
                trust_ratio = w_norm / u_norm
                p.add_(update * trust_ratio, alpha=-group["lr"])
        return loss


class ReZeroBlock(nn.Module):
    """Transformer block with ReZero residuals: x + alpha * f(x), alpha initialised to 0 (no LayerNorm)."""

    def __init__(self, d, heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.alpha_attn = nn.Parameter(torch.zeros(1))
        self.alpha_ff = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        x = x + self.alpha_attn * self.attn(x, x, x, need_weights=False)[0]
        return x + self.alpha_ff * self.ff(x)


class SeqClassifier(nn.Module):
    def __init__(self, vocab=50, d=32, heads=4, depth=3, n_cls=3, T=24):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, T, d) * 0.1)
        self.blocks = nn.ModuleList(ReZeroBlock(d, heads) for _ in range(depth))
        self.head = nn.Linear(d, n_cls)

    def forward(self, ids):
        x = self.embed(ids) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(x.mean(1))


def batch(b, g):
    ids = torch.randint(0, 50, (b, 24), generator=g)
    y = (ids[:, :8] < 10).sum(1).clamp(max=2)      # how many "rare" tokens in the prefix (0, 1, 2+)
    return ids, y


model = SeqClassifier()
opt = Lamb(model.parameters(), lr=2e-3, weight_decay=0.01)
g = torch.Generator().manual_seed(0)
for step in range(50):
    ids, y = batch(64, g)
    loss = F.cross_entropy(model(ids), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step:3d} loss {loss.item():.4f}")
print("final loss", loss.item())
