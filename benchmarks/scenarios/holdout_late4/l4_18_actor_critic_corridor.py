# expect: {"healthy": true}
# about: held out (round late 4): an actor-critic agent on a batched corridor environment; as returns improve the policy and value losses first rise sharply (value loss ~2.8 -> ~50) before settling and the entropy collapses toward 0, all computed with log-softmax so it stays finite.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical


class Corridor:
    """Batched 1-D corridor: start in the middle, reward +10 at the right end, -1 at the left end."""

    def __init__(self, n_envs, length, gen):
        self.n, self.length, self.gen = n_envs, length, gen
        self.pos = torch.full((n_envs,), length // 2)

    def reset(self):
        self.pos = torch.full((self.n,), self.length // 2)
        return self.obs()

    def obs(self):
        onehot = F.one_hot(self.pos, self.length).float()
        return onehot + 0.05 * torch.randn(self.n, self.length, generator=self.gen)

    def step(self, action):
        # action 0 = left, 1 = stay, 2 = right; 10% of moves slip
        slip = torch.rand(self.n, generator=self.gen) < 0.1
        move = torch.where(slip, torch.zeros_like(action), action - 1)
        self.pos = (self.pos + move).clamp(0, self.length - 1)
        reward = torch.where(self.pos == self.length - 1, 10.0, torch.where(self.pos == 0, -1.0, -0.05))
        done = (self.pos == 0) | (self.pos == self.length - 1)
        return reward, done


class ActorCritic(nn.Module):
    def __init__(self, d_obs, n_actions=3, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_obs, hidden), nn.Tanh())
        self.pi = nn.Linear(hidden, n_actions)
        self.v = nn.Linear(hidden, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--updates", type=int, default=250)
    p.add_argument("--envs", type=int, default=32)
    p.add_argument("--horizon", type=int, default=30)
    p.add_argument("--gamma", type=float, default=0.97)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    env = Corridor(args.envs, 16, gen)
    net = ActorCritic(16)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    for upd in range(args.updates):
        obs = env.reset()
        logps, values, rewards, alive_masks, entropies = [], [], [], [], []
        alive = torch.ones(args.envs)
        for t in range(args.horizon):
            logits, value = net(obs)
            dist = Categorical(logits=logits)
            action = torch.multinomial(dist.probs.detach(), 1, generator=gen).squeeze(1)
            logps.append(dist.log_prob(action))
            entropies.append(dist.entropy())
            values.append(value)
            r, done = env.step(action)
            rewards.append(r * alive)
            alive_masks.append(alive)
            alive = alive * (~done).float()
            obs = env.obs()
        returns, g = [], torch.zeros(args.envs)
        for r, m in zip(reversed(rewards), reversed(alive_masks)):
            g = r + args.gamma * g * m
            returns.append(g)
        returns = torch.stack(returns[::-1])
        logps, values, masks = torch.stack(logps), torch.stack(values), torch.stack(alive_masks)
        adv = (returns - values).detach()
        policy_loss = -(logps * adv * masks).sum() / masks.sum()
        value_loss = ((returns - values) ** 2 * masks).sum() / masks.sum()
        entropy = (torch.stack(entropies) * masks).sum() / masks.sum()
        loss = policy_loss + 0.5 * value_loss - 0.01 * entropy
        opt.zero_grad()
        loss.backward()
        opt.step()
        if upd % 20 == 0:
            print(f"update {upd:4d} return {returns[0].mean().item():6.2f} policy loss {policy_loss.item():8.3f} "
                  f"value loss {value_loss.item():8.3f} entropy {entropy.item():.3f}")


if __name__ == "__main__":
    main()
