# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.addmm.default", "module": "2"}
# guess before tracer: weights grow x(1+lr*|wd|)=x1.15 per step regardless of the gradient, so the logits blow up after ~100+ steps; cross_entropy is overflow-safe, so the first inf is likely an addmm (the deepest Linear) or something in the backward. Cause-wise no id fits exactly: the weights "grew step after step" (learning-rate-too-high by the README's definition) but the bug is weight_decay=-0.3 (a sign error), and lowering lr only slows it. reftrace: aten.addmm.default in Linear "2" at step 46.
# about: held out (round 3): written after the code by someone who had not read it or the suite. an MLP classifier with SGD(lr=0.5) and decoupled weight decay applied by hand after each step (p.mul_(1 - lr*wd)) where wd=-0.3: the author flipped the sign while moving the L2 term out of the loss; every step multiplies every weight by 1.15.
import torch
from torch import nn

torch.manual_seed(8)
torch.set_num_threads(1)

X = torch.randn(1024, 32)
Y = (X[:, :8].sum(1) > 0).long() + 2 * (X[:, 8] > 0.5).long()
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
lr, wd = 0.5, -0.3  # BUG: sign flipped when the L2 term was moved out of the loss
opt = torch.optim.SGD(model.parameters(), lr=lr)
for step in range(400):
    idx = torch.arange(step * 64, step * 64 + 64) % 1024
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(X[idx]), Y[idx])
    loss.backward()
    opt.step()
    with torch.no_grad():  # decoupled weight decay, by hand
        for p in model.parameters():
            p.mul_(1 - lr * wd)
    if step % 20 == 0:
        print(f"step {step} loss {loss.item():.4g}")
