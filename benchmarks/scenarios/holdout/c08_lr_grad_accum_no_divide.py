# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": null}
# guess before tracer: the effective lr is 16x the intended 0.08 (=1.28) on a regression MLP; weights grow geometrically over optimizer steps; first overflow probably aten.mse_loss or an addmm in the forward of a micro-batch; reftrace: aten.mse_loss.default at optimizer step 5 (a micro-batch loss), module null
# about: held out (round 3): written after the code by someone who had not read it or the suite. gradient accumulation over 16 micro-batches where loss.backward() is called on the un-divided loss; with SGD(lr=0.08, momentum=0.9) tuned for the full batch, every update is 16x too big.
import torch
from torch import nn

torch.manual_seed(9)
torch.set_num_threads(1)

X = torch.randn(4096, 16)
Y = X[:, :4] @ torch.tensor([[1.0], [2.0], [-1.0], [0.5]]) + 0.1 * torch.randn(4096, 1)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.08, momentum=0.9)
ACC = 16
for step in range(60):
    opt.zero_grad()
    for k in range(ACC):
        i = (step * ACC + k) * 16 % 4096
        loss = nn.functional.mse_loss(model(X[i:i + 16]), Y[i:i + 16])
        loss.backward()  # BUG: should be (loss / ACC).backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4g}")
