# expect: {"healthy": true}
# about: held out (round late 2): REINFORCE (no baseline) on a vectorised corridor environment; as the policy learns to walk right the returns grow, so the surrogate loss triples over the first ~80 updates before settling, while the run stays finite throughout.
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--updates", type=int, default=250)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--envs", type=int, default=32)
parser.add_argument("--horizon", type=int, default=20)
args = parser.parse_args()

torch.manual_seed(13)

LENGTH = 25  # corridor cells 0..LENGTH-1; reward each step = how far along the corridor the agent is


class Corridor:
    def __init__(self, n):
        self.n = n

    def reset(self):
        self.pos = torch.zeros(self.n, dtype=torch.long)
        return self.obs()

    def obs(self):
        one_hot = torch.zeros(self.n, LENGTH)
        one_hot[torch.arange(self.n), self.pos] = 1.0
        return one_hot

    def step(self, action):  # 0 = left, 1 = stay, 2 = right
        self.pos = (self.pos + action - 1).clamp(0, LENGTH - 1)
        reward = self.pos.float() / 5.0
        return self.obs(), reward


class PolicyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(LENGTH, 64), nn.ReLU(), nn.Linear(64, 3))

    def forward(self, obs):
        return torch.distributions.Categorical(logits=self.net(obs))


env = Corridor(args.envs)
policy = PolicyNet()
opt = torch.optim.Adam(policy.parameters(), lr=args.lr)
gamma = 0.99

for update in range(args.updates):
    obs = env.reset()
    logps, rewards = [], []
    for t in range(args.horizon):
        dist = policy(obs)
        a = dist.sample()
        logps.append(dist.log_prob(a))
        obs, r = env.step(a)
        rewards.append(r)
    # discounted returns-to-go
    returns, g = [], torch.zeros(args.envs)
    for r in reversed(rewards):
        g = r + gamma * g
        returns.insert(0, g)
    returns = torch.stack(returns)             # (T, envs)
    logps = torch.stack(logps)
    loss = -(logps * returns).sum(0).mean()    # vanilla REINFORCE, no baseline
    opt.zero_grad()
    loss.backward()
    opt.step()
    if update % 25 == 0:
        ep_ret = torch.stack(rewards).sum(0).mean().item()
        print(f"update {update:4d}  episode return {ep_ret:7.2f}  loss {loss.item():9.3f}")

print(f"final loss {loss.item():.4f}")
