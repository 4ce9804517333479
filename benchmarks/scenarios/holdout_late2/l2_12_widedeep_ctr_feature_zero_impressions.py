# expect: {"cause": "nonfinite-input", "phase": "forward", "op": "aten.div.Tensor", "module": ""}
# about: held out (round late 2): Wide & Deep conversion model streamed over a time-ordered ad log with a CTR feature computed on the fly as clicks / impressions; campaigns launched on day 27 have 0 impressions, so the feature is 0/0 = NaN at step 337 and training continues on NaN.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--batch", type=int, default=128)
args = parser.parse_args()

torch.manual_seed(12)

# ---- synthetic ad log, one row per (ad, site, day), ordered by day (streamed in time order) ----
N_DAYS, ROWS_PER_DAY, N_ADS, N_SITES = 30, 1600, 500, 40
day = torch.arange(N_DAYS).repeat_interleave(ROWS_PER_DAY)
N = day.numel()
launch_day = -torch.randint(5, 60, (N_ADS,))           # most campaigns were already running
launch_day[-20:] = 27                                   # a batch of new campaigns launched on day 27
ad = torch.where(day >= 27, torch.randint(0, N_ADS, (N,)), torch.randint(0, N_ADS - 20, (N,)))
site = torch.randint(0, N_SITES, (N,))
age = (day - launch_day[ad]).float()
base_rate = 40.0 * (1 - torch.exp(-age / 3.0))          # delivery ramps up after launch
impressions = torch.poisson(base_rate)
quality = torch.randn(N_ADS) * 0.5
true_ctr = torch.sigmoid(-3.5 + quality[ad] + 0.3 * torch.randn(N))
clicks = torch.binomial(impressions, true_ctr)
label = (torch.rand(N) < torch.sigmoid(2 * quality[ad] + 3 * (true_ctr - 0.03))).float()  # converted next day


def featurize(i):
    """Dense features computed on the fly from the raw counters."""
    imp, clk = impressions[i], clicks[i]
    ctr = clk / imp
    return torch.stack([torch.log1p(imp), ctr * 10.0, age[i] / 30.0], dim=1)


class WideDeep(nn.Module):
    def __init__(self, n_ads, n_sites, n_dense=3, emb=16):
        super().__init__()
        self.ad_emb = nn.Embedding(n_ads, emb)
        self.site_emb = nn.Embedding(n_sites, emb)
        self.wide = nn.Linear(n_dense, 1)
        self.deep = nn.Sequential(nn.Linear(2 * emb + n_dense, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, ad_ids, site_ids, dense):
        h = torch.cat([self.ad_emb(ad_ids), self.site_emb(site_ids), dense], dim=1)
        return (self.wide(dense) + self.deep(h)).squeeze(-1)


model = WideDeep(N_ADS, N_SITES)
opt = torch.optim.Adam(model.parameters(), lr=args.lr)

step = 0
for epoch in range(args.epochs):
    for start in range(0, N, args.batch):
        i = torch.arange(start, min(start + args.batch, N))
        logits = model(ad[i], site[i], featurize(i))
        loss = F.binary_cross_entropy_with_logits(logits, label[i])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step:4d}  day {int(day[i[0]])}  logloss {loss.item():.4f}")
        step += 1

print(f"final loss {loss.item():.4f}")
