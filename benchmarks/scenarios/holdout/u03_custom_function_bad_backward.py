# expect: {"cause": "unsafe-op", "phase": "backward", "op": "aten.div.Tensor", "module": "blocks.1.act", "grad_fn": "SqrtReLUBackward"}
# about: held out (round 2): written after the code by someone who had not read it or the suite. a "smooth" activation written as a custom torch.autograd.Function: forward
# sqrt(relu(x)), hand-written backward  grad * 0.5 / out  with no guard for out == 0.
# Every unit with x <= 0 gives out = 0 -> 0.5*grad/0 = +-inf (or 0/0 = NaN) in the backward of
# the first step. The first division to run in the backward is the one of the LAST use of
# the function (blocks.1.act), since backward goes in reverse order.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)


class SqrtReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = torch.sqrt(torch.clamp(x, min=0))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (out,) = ctx.saved_tensors
        return grad_out * 0.5 / out          # bug: no eps / mask for out == 0


class SqrtAct(nn.Module):
    def forward(self, x):
        return SqrtReLU.apply(x)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.act = SqrtAct()

    def forward(self, x):
        return x + self.act(self.fc(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(10, 32)
        self.blocks = nn.ModuleList([Block(32) for _ in range(2)])
        self.out = nn.Linear(32, 3)

    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


X = torch.randn(256, 10)
Y = (X[:, 0] > 0).long() + (X[:, 1] > 1).long()
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for epoch in range(5):
    for i in range(0, 256, 32):
        opt.zero_grad()
        loss = F.cross_entropy(model(X[i:i + 32]), Y[i:i + 32])
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")
