# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.exp.default", "module": [null, ""]}
# about: an RBM trained with contrastive divergence on raw 0-255 pixels; the free energy log(1 + exp(W v + c)) overflows exp and the loss becomes inf - inf.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)


class RBM(nn.Module):
    def __init__(self, n_vis=64, n_hid=32, k=1):
        super().__init__()
        self.W = nn.Parameter(torch.randn(n_hid, n_vis) * 0.01)
        self.v_bias = nn.Parameter(torch.zeros(n_vis))
        self.h_bias = nn.Parameter(torch.zeros(n_hid))
        self.k = k

    def sample_h(self, v):
        p = torch.sigmoid(nn.functional.linear(v, self.W, self.h_bias))
        return p, torch.bernoulli(p)

    def sample_v(self, h):
        p = torch.sigmoid(nn.functional.linear(h, self.W.t(), self.v_bias))
        return p, torch.bernoulli(p)

    def forward(self, v):
        _, h = self.sample_h(v)
        for _ in range(self.k):
            _, v_k = self.sample_v(h)
            _, h = self.sample_h(v_k)
        return v, v_k

    def free_energy(self, v):
        vbias_term = v.mv(self.v_bias)
        wx_b = nn.functional.linear(v, self.W, self.h_bias)
        if FIXED:  # softplus: log(1 + exp(x)) without overflowing exp
            hidden_term = nn.functional.softplus(wx_b).sum(1)
        else:
            hidden_term = torch.log(1 + torch.exp(wx_b)).sum(1)
        return -hidden_term - vbias_term


# 8x8 "images" as raw 0..255 intensities (the /255 was forgotten)
images = (torch.rand(512, 64) > 0.5).float() * 255.0
rbm = RBM()
optimizer = torch.optim.SGD(rbm.parameters(), lr=1e-5)

for step in range(60):
    v = images[torch.randint(0, 512, (32,))]
    v, v1 = rbm(v)
    loss = rbm.free_energy(v).mean() - rbm.free_energy(v1).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.3f}")
print(f"final loss {loss.item():.6g}")
