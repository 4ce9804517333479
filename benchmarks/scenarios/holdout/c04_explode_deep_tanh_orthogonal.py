# expect: {"cause": "exploding-gradients", "phase": "backward", "op": "aten.mm.default", "module": ["150", "152", "154", "156", "158", "160", "162", "164", "166", "168", "170", "172", "174", "176", "178", "180", "182", "184", "186", "188", "190"]}
# guess before tracer: aten.mm.default (W^T g, grad wrt a layer input) or tanh_backward in some deep layer, step 0; reftrace: aten.mm.default in AddmmBackward0 of Linear "160" at step 0. Arguably bad-initialization in spirit (it is the init), but the README defines bad-initialization as activations overflowing, and here no activation exceeds 1.
# platform: the Linear where the first backward overflows depends on MKL's code path (measured: '152' on AVX-512, '162' with MKL_CBWR=AVX2, '186' with MKL_CBWR=AVX, '188' with MKL_CBWR=COMPATIBLE, '160' where it was written), so the label takes the Linear layers 150-190; the op is always mm at step 0.
# about: held out (round 3): written after the code by someone who had not read it or the suite. a 400-layer tanh MLP ("deep signal propagation" experiment) with orthogonal_(gain=3.0) weights: tanh keeps every activation in [-1,1] so the forward never overflows, but in this chaotic regime the backward Jacobian product grows geometrically with depth and overflows in the first backward pass.
import torch
from torch import nn

torch.manual_seed(4)
torch.set_num_threads(1)

layers = []
for i in range(400):
    lin = nn.Linear(48 if i else 10, 48)
    nn.init.orthogonal_(lin.weight, gain=3.0)
    nn.init.zeros_(lin.bias)
    layers += [lin, nn.Tanh()]
model = nn.Sequential(*layers, nn.Linear(48, 1))
x = torch.randn(128, 10)
y = torch.sin(x[:, :1]) + 0.1 * x[:, 1:2]
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(5):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4g}")
