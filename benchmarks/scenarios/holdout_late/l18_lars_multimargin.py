# expect: {"cause": "optimizer-state", "phase": "optimizer", "op": "aten.div.Tensor", "module": ""}
# about: held out (round late): an MLP trained with MultiMarginLoss and a hand-written LARS optimizer whose trust ratio ||w||/||g|| has no epsilon or zero guard; once a batch has every margin satisfied the gradient is exactly zero and the ratio is x/0 = inf at step 47.
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(8)
torch.set_num_threads(1)


class LARS(torch.optim.Optimizer):
    """Layer-wise adaptive rate scaling (You et al. 2017), written from the paper."""

    def __init__(self, params, lr=0.1, momentum=0.9, trust_coef=0.02, weight_decay=0.0):
        defaults = dict(lr=lr, momentum=momentum, trust_coef=trust_coef, weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if group["weight_decay"] != 0:
                    g = g.add(p, alpha=group["weight_decay"])
                w_norm = torch.norm(p)
                g_norm = torch.norm(g)
                # local lr: eta * ||w|| / ||g||
                local_lr = group["trust_coef"] * w_norm / g_norm
                buf = self.state[p].get("momentum_buffer")
                if buf is None:
                    buf = torch.zeros_like(p)
                    self.state[p]["momentum_buffer"] = buf
                buf.mul_(group["momentum"]).add_(g * local_lr * group["lr"])
                p.sub_(buf)


# 4-class problem, linearly separable with a margin
N, D, C = 3000, 32, 4
means = torch.randn(C, D) * 1.2
labels = torch.randint(0, C, (N,))
X = means[labels] + 1.0 * torch.randn(N, D)
loader = DataLoader(TensorDataset(X, labels), batch_size=64, shuffle=True)

model = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, C))
for m in model:
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.bias, std=0.01)   # LARS scales by ||w||, so avoid all-zero biases
criterion = nn.MultiMarginLoss(margin=1.0)   # multi-class hinge loss
optimizer = LARS(model.parameters(), lr=0.1, momentum=0.9, trust_coef=0.01)

step = 0
while step < 300:
    for xb, yb in loader:
        out = model(xb)
        loss = criterion(out, yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            acc = (out.argmax(1) == yb).float().mean()
            print(f"step {step:4d}  hinge {loss.item():.5f}  acc {acc.item():.3f}")
        step += 1
        if step >= 300:
            break
