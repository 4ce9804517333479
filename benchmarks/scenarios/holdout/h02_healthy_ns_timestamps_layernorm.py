# expect: {"healthy": true}
# about: held out (round 3): written after the code by someone who had not read it or the suite. control with huge but finite activations: a raw nanosecond timestamp feature (~1.7e18) goes straight into a Linear, giving pre-norm activations ~1e17-1e18 whose variance (~1e35) still fits float32; a LayerNorm right after brings them back to O(1). Logits are also scaled by 1e4 into cross_entropy (logsumexp is overflow-safe). Adam(lr=3e-3). Nothing non-finite.
import torch
from torch import nn

torch.manual_seed(21)
torch.set_num_threads(1)
ts = 1.7e18 + 1e15 * torch.rand(1024, 1)
other = torch.randn(1024, 7)
X = torch.cat([ts, other], 1)
Y = (other[:, 0] > 0).long()
model = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
for step in range(60):
    s = slice(step * 64 % 1024, step * 64 % 1024 + 64)
    opt.zero_grad()
    logits = model(X[s]) * 1e4
    loss = nn.functional.cross_entropy(logits, Y[s])
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.6g} |pre-norm| {model[0](X[s]).abs().max().item():.3g}")
