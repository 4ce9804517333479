# expect: {"cause": "low-precision-overflow", "phase": "forward", "op": "aten.exp.default", "module": null}
# about: held out (round early): A GRUCell forecaster of hourly page-view counts (Poisson NLL with a log link) runs under float16 CPU autocast; as it learns the scale of the biggest sites the fp16 log-rate passes 11.09 and at step 15 exp(log_rate) overflows 65504 to inf (the same run in fp32 stays finite).
import math
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)

# ---- synthetic hourly page-view counts for sites of very different sizes (3k .. 100k views/hour) ----
N, T = 256, 48
t = torch.arange(T).float()
scale = 10 ** (3.5 + 1.5 * torch.rand(N, 1))            # log-uniform site size
daily = 1 + 0.6 * torch.sin(2 * math.pi * t / 24 + 6.28 * torch.rand(N, 1))
counts = torch.poisson(scale * daily)


class CountForecaster(nn.Module):
    """GRU cell stepped over log1p(counts); emits the log of a Poisson rate for the next hour."""

    def __init__(self, hid=64):
        super().__init__()
        self.cell = nn.GRUCell(1, hid)
        self.head = nn.Linear(hid, 1)

    def forward(self, x):
        h = x.new_zeros(x.shape[0], self.cell.hidden_size)
        outs = []
        for i in range(x.shape[1]):
            h = self.cell(torch.log1p(x[:, i:i + 1]), h)
            outs.append(self.head(h))
        return torch.cat(outs, 1)


model = CountForecaster()
opt = torch.optim.Adam(model.parameters(), lr=0.01)

step = 0
for epoch in range(12):
    perm = torch.randperm(N)
    for i in range(0, N, 32):
        batch = counts[perm[i:i + 32]]
        with torch.autocast("cpu", dtype=torch.float16):       # mixed precision for speed
            log_rate = model(batch[:, :-1])
            rate = torch.exp(log_rate)
            loss = (rate - batch[:, 1:] * log_rate).mean()      # Poisson NLL (up to a constant)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch {epoch} step {step:3d} poisson-nll {loss.item():.1f} max log-rate {log_rate.max().item():.2f}")
        step += 1
