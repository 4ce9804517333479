"""Mixture-of-experts classifier on a synthetic 5-class tabular task: a softmax gate mixes four
expert MLPs and the model is trained on the marginal likelihood sum_k g_k * p_k(y|x).
Latent hazard (line 25): MixtureOfExperts.nll() takes torch.log of the mixed probability with no
floor; log(0) needs every expert's p(y|x) to underflow at once, which never happens here."""
import argparse

import torch
import torch.nn as nn


class MixtureOfExperts(nn.Module):
    def __init__(self, n_in, n_classes, n_experts=4, hidden=32):
        super().__init__()
        self.gate = nn.Linear(n_in, n_experts)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))
            for _ in range(n_experts)
        )

    def nll(self, x, y):
        gate = torch.softmax(self.gate(x), dim=-1)                                  # (B, K)
        expert_probs = torch.stack([torch.softmax(e(x), dim=-1) for e in self.experts], 1)  # (B, K, C)
        idx = y.view(-1, 1, 1).expand(-1, expert_probs.shape[1], 1)
        component = expert_probs.gather(2, idx).squeeze(-1)                       # (B, K)
        lik = torch.log((gate * component).sum(-1))
        return -lik.mean()


def make_data(n, n_in=12, n_classes=5):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, n_in, generator=g)
    region = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()  # four regimes
    w = torch.randn(4, n_in, n_classes, generator=g)
    logits = torch.einsum("ni,nic->nc", x, w[region])
    y = logits.argmax(-1)
    return x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    torch.manual_seed(0)
    x, y = make_data(2048)
    moe = MixtureOfExperts(x.shape[1], 5)
    opt = torch.optim.Adam(moe.parameters(), lr=3e-3)
    for step in range(args.steps):
        batch = torch.randint(0, x.shape[0], (128,))
        loss = moe.nll(x[batch], y[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"{step:>4} nll {loss.item():.4f}")
    print(f"final nll {loss.item():.4f}")


if __name__ == "__main__":
    main()
