# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.log.default", "module": "head"}
# about: held out (round late 4): REINFORCE on a contextual bandit whose head computes torch.log(torch.softmax(...)) instead of log_softmax; as the policy becomes near-deterministic the logit gap grows until a non-chosen action's probability underflows to exactly 0 and log gives -inf at step 269 in the policy head.
import argparse

import torch
import torch.nn as nn


class CategoricalHead(nn.Module):
    def __init__(self, d, n_actions):
        super().__init__()
        self.logits = nn.Linear(d, n_actions)

    def forward(self, h):
        probs = torch.softmax(self.logits(h), dim=-1)
        return probs, torch.log(probs)


class Policy(nn.Module):
    def __init__(self, d_ctx, n_actions):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_ctx, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = CategoricalHead(64, n_actions)

    def forward(self, ctx):
        return self.head(self.body(ctx))


class ContextualBandit:
    """Each context has one clearly best arm; rewards are noisy."""

    def __init__(self, d_ctx, n_actions, gen):
        self.w = torch.randn(d_ctx, n_actions, generator=gen)
        self.gen = gen
        self.d_ctx = d_ctx

    def contexts(self, n):
        return torch.randn(n, self.d_ctx, generator=self.gen)

    def reward(self, ctx, actions):
        scores = ctx @ self.w
        best = scores.argmax(1)
        r = (actions == best).float() + 0.1 * torch.randn(len(actions), generator=self.gen)
        return r


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=600)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--entropy-coef", type=float, default=1e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    env = ContextualBandit(16, 6, torch.Generator().manual_seed(0))
    policy = Policy(16, 6)
    opt = torch.optim.Adam(policy.parameters(), lr=args.lr)
    sample_gen = torch.Generator().manual_seed(1)
    baseline = 0.0
    for it in range(args.iters):
        ctx = env.contexts(args.batch)
        probs, logp = policy(ctx)
        actions = torch.multinomial(probs.detach(), 1, generator=sample_gen).squeeze(1)
        rewards = env.reward(ctx, actions)
        baseline = 0.9 * baseline + 0.1 * rewards.mean().item()
        adv = rewards - baseline
        chosen_logp = logp.gather(1, actions[:, None]).squeeze(1)
        entropy = -(probs * logp).sum(1).mean()
        loss = -(adv * chosen_logp).mean() - args.entropy_coef * entropy
        opt.zero_grad()
        loss.backward()
        opt.step()
        if it % 25 == 0:
            print(f"iter {it:4d} mean reward {rewards.mean().item():.3f} entropy {entropy.item():.4f}")


if __name__ == "__main__":
    main()
