"""Healthy control: one-step actor-critic on a contextual "route choice" task with 8 actions;
the policy uses torch.distributions.Categorical(logits=...) for log_prob and entropy, the critic
uses smooth-L1, and advantages are normalised with (adv - mean) / (std + 1e-8)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical


class ActorCritic(nn.Module):
    def __init__(self, obs_dim=6, n_actions=8, hidden=64):
        super().__init__()
        self.shared = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh())
        self.pi = nn.Linear(hidden, n_actions)
        self.v = nn.Linear(hidden, 1)

    def forward(self, obs):
        h = self.shared(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def route_costs(obs, w):
    return obs @ w  # (B, n_actions) expected travel time per route


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()

    torch.manual_seed(0)
    w = torch.randn(6, 8)
    ac = ActorCritic()
    opt = torch.optim.Adam(ac.parameters(), lr=3e-3)
    for step in range(args.steps):
        obs = torch.randn(256, 6)
        logits, value = ac(obs)
        dist = Categorical(logits=logits)
        action = dist.sample()
        with torch.no_grad():
            cost = route_costs(obs, w).gather(1, action.unsqueeze(1)).squeeze(1)
            reward = -cost + 0.3 * torch.randn_like(cost)
        adv = (reward - value).detach()
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)

        actor = -(dist.log_prob(action) * adv).mean()
        critic = F.smooth_l1_loss(value, reward)
        entropy = dist.entropy().mean()
        loss = actor + 0.5 * critic - 0.01 * entropy
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(ac.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f} reward {reward.mean().item():.3f} H {entropy.item():.3f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
