# expect: {"cause": "optimizer-state", "phase": "optimizer", "op": ["aten.addcdiv_.default", "aten._foreach_addcdiv_.ScalarList"], "module": ""}
# about: held out (round late): a progressively grown residual MLP that appends a ReZero block (gate initialised at 0) when the smoothed loss plateaus, trained with Adam(eps=0); the new block's inner weights get exactly-zero gradients, so Adam computes 0/0 in the update at step 100.
import torch
import torch.nn as nn

torch.manual_seed(7)
torch.set_num_threads(1)

# Progressive growing of a residual MLP: start shallow and append a new
# ReZero-style residual block (residual gate initialised at 0, so the new block
# starts as the identity) whenever the training loss plateaus.
N, D = 4096, 24
X = torch.randn(N, D)
W1 = torch.randn(D, D) / D ** 0.5
y = torch.sin(X @ W1).sum(1, keepdim=True) + 0.5 * (X[:, :4] ** 2).sum(1, keepdim=True)


class ReZeroBlock(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.gate = nn.Parameter(torch.zeros(1))

    def forward(self, h):
        return h + self.gate * self.ff(h)


class GrowingResNet(nn.Module):
    def __init__(self, d_in, width=64):
        super().__init__()
        self.width = width
        self.stem = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList()
        self.head = nn.Linear(width, 1)

    def grow(self):
        block = ReZeroBlock(self.width)
        self.blocks.append(block)
        return list(block.parameters())

    def forward(self, x):
        h = torch.relu(self.stem(x))
        for blk in self.blocks:
            h = blk(h)
        return self.head(h)


model = GrowingResNet(D)
# eps=0: "exact" Adam, no fudge term in the denominator
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, eps=0.0)
loss_fn = nn.MSELoss()
batch_size = 128
ema, last_check = None, None

for step in range(400):
    idx = torch.randint(0, N, (batch_size,))
    pred = model(X[idx])
    loss = loss_fn(pred, y[idx])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    ema = loss.item() if ema is None else 0.9 * ema + 0.1 * loss.item()
    if step % 10 == 9:
        # grow when the smoothed loss improved by less than 5% over the last 10 steps
        if last_check is not None and ema > 0.95 * last_check and len(model.blocks) < 4:
            optimizer.add_param_group({"params": model.grow()})
            print(f"step {step}: loss plateaued, growing to {len(model.blocks)} blocks")
        last_check = ema
    if step % 10 == 0:
        print(f"step {step:4d}  loss {loss.item():.4f}  blocks {len(model.blocks)}")
