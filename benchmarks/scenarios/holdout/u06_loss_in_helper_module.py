# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.log.default", "module": null, "source": "_u06_losses_helper.py:9"}
# about: held out (round 2): written after the code by someone who had not read it or the suite. click-through prediction with a 2-layer MLP on un-standardised count features (0..60).
# The loss lives in a helper module (_u06_losses_helper.weighted_bce): sigmoid then log by
# hand. Once the model gets confident (epoch 2-3), sigmoid(logit) rounds to exactly 1.0 for
# some row (logit > ~17; a confident positive gives (1-1)*log(0) = 0*-inf = NaN, a
# mislabelled negative gives -inf): log(1 - 1.0) = log(0) = -inf. Origin: the
# log(1 - p) in the helper file, line 9 -- not a line of this script. Outside any module ->
# module null. (A mislabelled positive with p == 0 would need logit < -103: not first.)
import torch
import torch.nn as nn

from _u06_losses_helper import accuracy, weighted_bce

torch.manual_seed(0)
torch.set_num_threads(1)

N = 3000
counts = torch.poisson(torch.rand(N, 12) * 30)           # raw counts, never standardised
clicked = ((counts[:, 0] - counts[:, 1]) > 0).float()
flip = torch.randperm(N)[:30]                             # 1% label noise (mis-logged clicks)
clicked[flip] = 1 - clicked[flip]

model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
for epoch in range(20):
    perm = torch.randperm(N)
    for k in range(0, N, 100):
        idx = perm[k:k + 100]
        logits = model(counts[idx]).squeeze(1)
        loss = weighted_bce(logits, clicked[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f} acc {accuracy(logits, clicked[idx]).item():.3f}")
