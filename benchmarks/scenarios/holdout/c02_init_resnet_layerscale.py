# expect: {"cause": "bad-initialization", "phase": "forward", "op": "aten.mean.dim", "module": ""}
# guess before tracer: aten.add.Tensor (residual add) or aten.mul.Tensor in blocks.K; reftrace: aten.mean.dim (global average pool sums 64 values ~1e37 before dividing) in the root module "" at step 0 — my guess was wrong
# about: held out (round 3): written after the code by someone who had not read it or the suite. a small ResNet-style CNN with a learnable per-block "layer scale" meant to be initialised to 1e-1 but written as 1e1; with kaiming convs every residual block multiplies the activation scale by ~4 (measured), so 64 blocks overflow in the first forward pass.
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(2)
torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.gamma = nn.Parameter(torch.full((1, c, 1, 1), 1e1))  # meant 1e-1

    def forward(self, x):
        return x + self.gamma * self.conv(F.relu(x))


class Net(nn.Module):
    def __init__(self, c=8, n=64):
        super().__init__()
        self.stem = nn.Conv2d(1, c, 3, padding=1)
        self.blocks = nn.Sequential(*[Block(c) for _ in range(n)])
        self.fc = nn.Linear(c, 10)

    def forward(self, x):
        h = self.blocks(self.stem(x))
        return self.fc(h.mean((2, 3)))


x = torch.randn(64, 1, 8, 8)
y = torch.randint(0, 10, (64,))
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(20):
    opt.zero_grad()
    loss = F.cross_entropy(model(x[step % 4 * 16:(step % 4 + 1) * 16]), y[step % 4 * 16:(step % 4 + 1) * 16])
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4g}")
