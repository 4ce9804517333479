# expect: {"healthy": true}
# about: held out (round 3): written after the code by someone who had not read it or the suite. control: a tanh nn.RNN with a large recurrent init (pre-clip gradient norms up to ~1e2 here) trained with a high SGD lr=0.5, kept stable by clip_grad_norm_(max_norm=1.0) before every step; gradient norms are big but far from overflow, so nothing non-finite appears.
import torch
from torch import nn

torch.manual_seed(22)
torch.set_num_threads(1)
rnn = nn.RNN(3, 24, batch_first=True)
nn.init.orthogonal_(rnn.weight_hh_l0, gain=1.8)
head = nn.Linear(24, 1)
params = list(rnn.parameters()) + list(head.parameters())
opt = torch.optim.SGD(params, lr=0.5, momentum=0.9)
for step in range(40):
    x = torch.randn(16, 80, 3)
    y = x[:, -5:, 0].sum(1, keepdim=True)
    opt.zero_grad()
    out, _ = rnn(x)
    loss = nn.functional.mse_loss(head(out[:, -1]), y)
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)
    opt.step()
    if step % 5 == 0:
        print(f"step {step} loss {loss.item():.6g} grad_norm {gn.item():.4g}")
