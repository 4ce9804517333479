# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": null}
# about: held out (round 2): written after the code by someone who had not read it or the suite. a multi-task MLP whose trunk is a ModuleList of ModuleDicts (each with a nested
# Sequential, no normalisation), SGD(momentum) + OneCycleLR with max_lr=0.15 (25x what this
# un-normalised residual trunk tolerates; constant lr 0.006 trains fine). OneCycle's warm-up
# ramps lr from 0.006 towards 0.15 over 120 steps, so training is fine at first and the
# weights blow up in the late 30s (lr ~0.04). Predicted before reftrace: "some trunk Linear
# addmm"; reftrace says the first overflow is the squared error in F.mse_loss (module null).
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_num_threads(1)


class Trunk(nn.Module):
    def __init__(self, d=48, depth=3):
        super().__init__()
        self.layers = nn.ModuleList([
            nn.ModuleDict({
                "ff": nn.Sequential(nn.Linear(d, d * 2), nn.ReLU(), nn.Linear(d * 2, d)),
                "gate": nn.Linear(d, d),
            })
            for _ in range(depth)
        ])
        self.heads = nn.ModuleDict({"reg": nn.Linear(d, 1), "cls": nn.Linear(d, 4)})

    def forward(self, x):
        for layer in self.layers:
            x = x + torch.sigmoid(layer["gate"](x)) * layer["ff"](x)
        return self.heads["reg"](x).squeeze(-1), self.heads["cls"](x)


X = torch.randn(4096, 48)
w = torch.randn(48)
y_reg = X @ w * 0.5
y_cls = (X[:, :4].argmax(1))

model = Trunk()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.15, total_steps=400)
for step in range(400):
    i = torch.arange(step * 20, step * 20 + 20) % 4096
    reg, logits = model(X[i])
    loss = F.mse_loss(reg, y_reg[i]) + F.cross_entropy(logits, y_cls[i])
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    if step % 20 == 0:
        print(f"step {step:3d} lr {sched.get_last_lr()[0]:.3f} loss {loss.item():.4f}")
