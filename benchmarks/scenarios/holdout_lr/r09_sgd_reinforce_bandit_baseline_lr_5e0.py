# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": ["", null]}
# about: held out (lr round): REINFORCE with a learned baseline on a hand-written 5-arm contextual bandit (one no_grad forward per pull), plain SGD at lr=5.0 instead of a sane 0.05 (100x), the baseline nn.MSELoss overflows to inf at step 11 and the script then crashes in Categorical(logits=nan).
"""REINFORCE with a learned baseline on a hand-written contextual bandit (5 arms), plain SGD."""
import argparse
import os

import torch
import torch.nn as nn
from torch.distributions import Categorical

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"

N_ARMS = 5
CTX = 6


class Bandit:
    """Reward of arm a in context c is <c, w_a> plus Gaussian noise."""

    def __init__(self, seed=3):
        g = torch.Generator().manual_seed(seed)
        self.w = torch.randn(N_ARMS, CTX, generator=g)

    def contexts(self, n):
        return torch.randn(n, CTX)

    def pull(self, ctx, arms):
        mean = (ctx * self.w[arms]).sum(-1)
        return mean + 0.3 * torch.randn_like(mean)


class PolicyWithBaseline(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(CTX, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.logits = nn.Linear(hidden, N_ARMS)
        self.baseline = nn.Linear(hidden, 1)

    def forward(self, ctx):
        h = self.trunk(ctx)
        return self.logits(h), self.baseline(h).squeeze(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=0.05 if FIXED else 5.0)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--pulls-per-iter", type=int, default=48)
    args = ap.parse_args()

    torch.manual_seed(0)
    env = Bandit()
    policy = PolicyWithBaseline()
    opt = torch.optim.SGD(policy.parameters(), lr=args.lr)
    mse = nn.MSELoss()
    recent = []
    for it in range(args.iters):
        # act: one no-grad forward per pull, like an online serving loop
        ctxs, arms, rewards = [], [], []
        with torch.no_grad():
            for _ in range(args.pulls_per_iter):
                c = env.contexts(1)
                logits, _ = policy(c)
                a = Categorical(logits=logits).sample()
                ctxs.append(c)
                arms.append(a)
                rewards.append(env.pull(c, a))
        ctx = torch.cat(ctxs)
        arm = torch.cat(arms)
        rew = torch.cat(rewards)
        recent.append(rew.mean().item())

        logits, base = policy(ctx)
        logp = torch.log_softmax(logits, -1).gather(1, arm[:, None]).squeeze(1)
        policy_loss = -((rew - base.detach()) * logp).mean()
        baseline_loss = mse(base, rew)
        opt.zero_grad()
        (policy_loss + baseline_loss).backward()
        opt.step()
        if it % 20 == 0:
            print(f"step {it} loss {policy_loss.item():.4f} baseline_loss {baseline_loss.item():.4f} "
                  f"mean_reward {rew.mean().item():.3f}")
    print(f"final return {sum(recent[-20:]) / 20}")
    print(f"final loss {policy_loss.item()}")


if __name__ == "__main__":
    main()
