# expect: {"healthy": true}
# about: held out (round late 3): a Gaussian REINFORCE policy on an unstable 1-D balancing task with reward-to-go and no baseline; the loss climbs from ~400 to ~2600 because it scales with the growing returns, but everything stays finite (log_std is clamped).
import argparse
import math

import torch
import torch.nn as nn


class GaussianPolicy(nn.Module):
    def __init__(self, d_obs=2, hidden=32):
        super().__init__()
        self.mean = nn.Sequential(nn.Linear(d_obs, hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.log_std = nn.Parameter(torch.zeros(1))

    def forward(self, obs):
        return self.mean(obs).squeeze(-1), self.log_std.clamp(-2.5, 1.0).exp()


def run_episodes(policy, n_episodes, horizon, g):
    """Unstable 1-D system x' = 1.1 x + 0.1 v, v' = v + a; +1 reward per step while |x| < 1."""
    x = 0.2 * torch.randn(n_episodes, generator=g)
    v = torch.zeros(n_episodes)
    alive = torch.ones(n_episodes)
    log_probs, rewards = [], []
    for t in range(horizon):
        obs = torch.stack([x, v], dim=-1)
        mu, std = policy(obs)
        noise = torch.randn(n_episodes, generator=g)
        a = (mu + std * noise).detach()
        lp = -0.5 * ((a - mu) / std) ** 2 - torch.log(std) - 0.5 * math.log(2 * math.pi)
        log_probs.append(lp * alive)
        v = 0.9 * v + 0.1 * a.clamp(-3, 3)
        x = 1.1 * x + 0.1 * v
        alive = alive * (x.abs() < 1.0).float()
        rewards.append(alive.clone())
    return torch.stack(log_probs, 1), torch.stack(rewards, 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--horizon", type=int, default=60)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    policy = GaussianPolicy()
    opt = torch.optim.Adam(policy.parameters(), lr=args.lr)

    for step in range(args.steps):
        log_probs, rewards = run_episodes(policy, args.episodes, args.horizon, g)
        # reward-to-go, no baseline: the loss scale grows with the returns
        reward_to_go = rewards.flip(1).cumsum(1).flip(1)
        loss = -(log_probs * reward_to_go).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            print(f"step {step:4d} mean return {rewards.sum(1).mean().item():6.1f} loss {loss.item():.2f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
