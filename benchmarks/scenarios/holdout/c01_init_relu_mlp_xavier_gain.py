# expect: {"cause": "bad-initialization", "phase": "forward", "op": "aten.addmm.default", "module": "blocks.59.0"}
# guess before tracer: addmm in one of the deep blocks.K.0 (K unknown, ~55-60 by 4.2^K*~1 > 3e38); reftrace: aten.addmm.default in blocks.59.0, step 0
# about: held out (round 3): written after the code by someone who had not read it or the suite. a 64-block plain ReLU MLP (no residuals, no norm) whose author "boosted" xavier_normal_ with gain=6 to fight vanishing gradients; each block multiplies the activation std by ~6/sqrt(2)=4.2, so a Linear overflows during the very first forward pass.
import torch
from torch import nn

torch.manual_seed(1)
torch.set_num_threads(1)


class DeepMLP(nn.Module):
    def __init__(self, d_in=16, width=96, depth=64):
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)])
        self.head = nn.Linear(width, 3)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_normal_(m.weight, gain=6.0)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        for b in self.blocks:
            h = b(h)
        return self.head(h)


X = torch.randn(512, 16)
Y = (X[:, :3].sum(1) > 0).long() + (X[:, 3] > 1).long()
model = DeepMLP()
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
for step in range(30):
    idx = torch.arange(step * 32, step * 32 + 32) % 512
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(X[idx]), Y[idx])
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4g}")
print("done")
