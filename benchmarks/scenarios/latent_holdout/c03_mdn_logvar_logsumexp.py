"""Healthy control: mixture density network for a multi-valued inverse problem (x = y + 0.3 sin(2 pi y)),
with log-weights from log_softmax, log-variances predicted directly and clamped, the mixture
log-likelihood via torch.logsumexp, plus an auxiliary unimodal head trained with F.gaussian_nll_loss."""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

LOG_2PI = math.log(2 * math.pi)


class MDN(nn.Module):
    def __init__(self, k=5, hidden=64):
        super().__init__()
        self.k = k
        self.body = nn.Sequential(nn.Linear(1, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, 3 * k)
        self.aux = nn.Linear(hidden, 2)

    def forward(self, x):
        h = self.body(x)
        logit_w, mu, log_var = self.head(h).split(self.k, dim=-1)
        log_var = log_var.clamp(-7.0, 7.0)
        aux_mu, aux_raw = self.aux(h).unbind(-1)
        return F.log_softmax(logit_w, -1), mu, log_var, aux_mu, F.softplus(aux_raw) + 1e-3


def mdn_nll(log_w, mu, log_var, y):
    y = y.unsqueeze(-1)
    comp = -0.5 * (LOG_2PI + log_var + (y - mu) ** 2 * torch.exp(-log_var))
    return -torch.logsumexp(log_w + comp, dim=-1).mean()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    torch.manual_seed(0)
    y_all = torch.rand(4000, 1) * 2 - 1
    x_all = y_all + 0.3 * torch.sin(2 * math.pi * y_all) + 0.05 * torch.randn_like(y_all)

    model = MDN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(args.steps):
        ix = torch.randint(0, 4000, (256,))
        xb, yb = x_all[ix], y_all[ix].squeeze(-1)
        log_w, mu, log_var, aux_mu, aux_var = model(xb)
        loss = mdn_nll(log_w, mu, log_var, yb) + 0.1 * F.gaussian_nll_loss(aux_mu, yb, aux_var, eps=1e-6)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step} nll {loss.item():.4f}")
    print(f"final nll {loss.item():.4f}")


if __name__ == "__main__":
    main()
