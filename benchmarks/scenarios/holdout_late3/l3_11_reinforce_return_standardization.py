# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.div.Tensor", "module": ""}
# about: held out (round late 3): a REINFORCE policy on a 10-step task with integer returns, standardising returns as (R - mean) / std across the batch; once the policy is good enough that all 64 episodes score exactly 10 the std is 0 and the advantage is 0/0 = NaN in the forward pass at step 191.
import argparse

import torch
import torch.nn as nn
from torch.distributions import Categorical


class Policy(nn.Module):
    def __init__(self, d_obs=8, n_actions=4, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_obs, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, n_actions))

    def forward(self, obs):
        return self.net(obs)


class SortingEnv:
    """Each episode shows 10 observations; the right action is the block of two features that is lit up.
    Reward is 1 for every correct action, so an episode's return is an integer between 0 and 10."""

    def __init__(self, horizon=10, d_obs=8, seed=0):
        self.horizon, self.d_obs = horizon, d_obs
        self.g = torch.Generator().manual_seed(seed)

    def rollout_obs(self, n_episodes):
        obs = torch.randn(n_episodes, self.horizon, self.d_obs, generator=self.g)
        hot = torch.randint(0, 4, (n_episodes, self.horizon), generator=self.g)
        # one block of two features is lit up
        return obs + 3.0 * torch.nn.functional.one_hot(hot, 4).repeat_interleave(2, dim=-1), hot

    def reward(self, hot, actions):
        return (actions == hot).float()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--episodes", type=int, default=64)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    env = SortingEnv()
    policy = Policy()
    opt = torch.optim.Adam(policy.parameters(), lr=args.lr)

    for step in range(args.steps):
        obs, hot = env.rollout_obs(args.episodes)
        dist = Categorical(logits=policy(obs))
        actions = dist.sample()
        rewards = env.reward(hot, actions)
        returns = rewards.sum(dim=1)
        # standardise returns across the batch of episodes (variance reduction)
        adv = (returns - returns.mean()) / returns.std()
        loss = -(dist.log_prob(actions).sum(dim=1) * adv).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step:4d} mean return {returns.mean().item():.2f} loss {loss.item():.4f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
