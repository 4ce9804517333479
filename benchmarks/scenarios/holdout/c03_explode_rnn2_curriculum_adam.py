# expect: {"cause": "exploding-gradients", "phase": "optimizer", "op": "aten.addcmul_.default", "module": [null, "gru"]}
# guess before tracer: the gradients grow ~10x per step with the curriculum while Adam keeps the weights moderate; Adam's grad*grad (exp_avg_sq, aten.addcmul_) overflows first at |grad| ~1.8e19, not the backward; reftrace (optimizer state as a sink): aten.addcmul_.default at step 23 on rnn.weight_ih_l0 exp_avg_sq (|grad| 4.5e21), optimizer phase, no module
# about: held out (round 3): written after the code by someone who had not read it or the suite. (Module label corrected by its author after the run: the attribute is named `gru`, left from an earlier GRU version of the script; it was "rnn".) a 2-layer tanh nn.RNN "running-sum" regressor with orthogonal_(gain=2.5) recurrent weights, a curriculum that lengthens sequences by 10 every step, and Adam(lr=1e-3); the forward is bounded by tanh, the gradient grows geometrically with length (13 at T=10, ~1e19 at T=210) while Adam's bounded steps keep the weights moderate.
import torch
from torch import nn

torch.manual_seed(3)
torch.set_num_threads(1)


class Model(nn.Module):
    def __init__(self, h=32):
        super().__init__()
        self.gru = nn.RNN(2, h, num_layers=2, batch_first=True)
        self.out = nn.Linear(h, 1)
        for name, p in self.gru.named_parameters():
            if "weight_hh" in name:
                for k in range(1):
                    nn.init.orthogonal_(p.data[k * h:(k + 1) * h], gain=2.5)

    def forward(self, x):
        y, _ = self.gru(x)
        return self.out(y[:, -1])


model = Model()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(40):
    T = 10 + 10 * step
    x = torch.randn(16, T, 2)
    target = x[:, :, :1].sum(1) / T ** 0.5
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), target)
    loss.backward()
    with torch.no_grad():
        gn = max(p.grad.abs().max() for p in model.parameters())
    opt.step()
    print(f"step {step} T {T} loss {loss.item():.4g} max|grad| {gn.item():.3g}")
