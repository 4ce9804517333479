# expect: {"cause": "nonfinite-parameters", "phase": "forward", "op": "parameter", "module": "proto"}
# guess before tracer: the NaN is made by aten.div.Tensor (0/0) in the user's re-normalisation (renormalise(), line of w.data / norm) at the start of step 9, after step 8's optimizer.step() — outside forward/backward/optimizer; a guard that checks at step() sees weights that are already NaN at step 9 -> nonfinite-parameters. First-principles origin: aten.div.Tensor, outside any module, source line of the renorm (arguably unsafe-op: 0/0). reftrace: raw origin aten.div.Tensor (0/0) at line 24 (renormalise), outside any module and phase, just before step 9; its taint is lost through the .data assignment, and the NaN weight is first consumed by proto (aten.t) in step 9 forward.
# about: held out (round 3): written after the code by someone who had not read it or the suite. a prototype (cosine) classifier; after every optimizer step the prototypes are re-normalised in place, w.data = w.data / w.data.norm(dim=1, keepdim=True); at step 9 a new class is added with a zero-initialised prototype row and everything is re-normalised right away; that row's norm is 0 -> it becomes NaN before the step-9 forward.
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(13)
torch.set_num_threads(1)


class ProtoNet(nn.Module):
    def __init__(self, d=16, k=5):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, d))
        self.proto = nn.Linear(d, k, bias=False)

    def forward(self, x):
        return 10.0 * self.proto(F.normalize(self.enc(x), dim=1))


def renormalise(model):
    w = model.proto.weight
    w.data = w.data / w.data.norm(dim=1, keepdim=True)


X = torch.randn(1024, 10)
Y = X[:, :5].argmax(1)
model = ProtoNet()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(30):
    if step == 9:  # a new class appears: grow the prototype matrix with a zero row
        with torch.no_grad():
            model.proto.weight = nn.Parameter(torch.cat([model.proto.weight.data, torch.zeros(1, 16)]))
        renormalise(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s = slice(step * 32 % 1024, step * 32 % 1024 + 32)
    opt.zero_grad()
    loss = F.cross_entropy(model(X[s]), Y[s])
    loss.backward()
    opt.step()
    renormalise(model)
    print(f"step {step} loss {loss.item():.4g}")
