# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": null}
# guess before tracer: fine for the first warmup steps, then once lr passes the stability limit (~2/curvature) the weights grow geometrically; first overflow probably the mse_loss or an addmm in the last layers; reftrace: aten.mse_loss.default at step 15 (lr had warmed up to ~1.2), module null
# about: held out (round 3): written after the code by someone who had not read it or the suite. a tabular MLP (LayerNorm-free, 3 Linear+GELU) with a hand-written LambdaLR linear warmup to a peak of 3.0 over 40 steps (peak meant to be 3e-3); stable at first, diverges once the warmed-up lr crosses the stability limit.
import torch
from torch import nn

torch.manual_seed(7)
torch.set_num_threads(1)

X = torch.randn(4096, 20)
w_true = torch.randn(20, 1)
Y = torch.tanh(X @ w_true) + 0.5 * X[:, :1]
model = nn.Sequential(nn.Linear(20, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 1))
peak, warm = 3.0, 40
opt = torch.optim.SGD(model.parameters(), lr=peak)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
for step in range(120):
    idx = torch.randint(0, 4096, (128,))
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(X[idx]), Y[idx])
    loss.backward()
    opt.step()
    sched.step()
    if step % 5 == 0:
        print(f"step {step} lr {sched.get_last_lr()[0]:.3g} loss {loss.item():.4g}")
