# expect: {"healthy": true}
# about: held out (round late 5): trains a REINFORCE policy on a batched 5x5 gridworld with log_softmax and advantages normalised by std + 1e-8; the policy loss rises from negative to positive and oscillates while returns improve, but everything stays finite.
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Policy(nn.Module):
    def __init__(self, n_states, n_actions, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_states, hidden), nn.Tanh(), nn.Linear(hidden, n_actions))

    def forward(self, s_onehot):
        return self.net(s_onehot)


class GridWorld:
    """5x5 grid, start top-left, goal bottom-right, a pit across the middle row; batched."""

    moves = torch.tensor([[-1, 0], [1, 0], [0, -1], [0, 1]])

    def __init__(self, n_envs, size=5):
        self.n, self.size = n_envs, size

    def reset(self):
        self.pos = torch.zeros(self.n, 2, dtype=torch.long)
        self.done = torch.zeros(self.n, dtype=torch.bool)
        return self.obs()

    def obs(self):
        idx = self.pos[:, 0] * self.size + self.pos[:, 1]
        return F.one_hot(idx, self.size * self.size).float()

    def step(self, a):
        new = (self.pos + self.moves[a]).clamp(0, self.size - 1)
        self.pos = torch.where(self.done[:, None], self.pos, new)
        at_goal = (self.pos == self.size - 1).all(1)
        in_pit = (self.pos[:, 0] == 2) & (self.pos[:, 1] >= 1) & (self.pos[:, 1] <= 3)
        r = torch.where(at_goal, 2.0, torch.where(in_pit, -0.5, -0.02))
        r = torch.where(self.done, torch.zeros_like(r), r)
        self.done = self.done | at_goal | in_pit
        return self.obs(), r


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--n-envs", type=int, default=32)
    p.add_argument("--horizon", type=int, default=20)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--gamma", type=float, default=0.97)
    args = p.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    env = GridWorld(args.n_envs)
    policy = Policy(25, 4)
    opt = torch.optim.Adam(policy.parameters(), lr=args.lr)

    for it in range(args.iters):
        s = env.reset()
        logps, rewards, alive = [], [], []
        for t in range(args.horizon):
            logits = policy(s)
            logp_all = F.log_softmax(logits, -1)
            a = torch.multinomial(logp_all.exp(), 1, generator=gen).squeeze(1)
            alive.append((~env.done).float())
            logps.append(logp_all.gather(1, a[:, None]).squeeze(1))
            s, r = env.step(a)
            rewards.append(r)
        R = torch.zeros(args.n_envs)
        returns = []
        for r in reversed(rewards):
            R = r + args.gamma * R
            returns.append(R)
        returns = torch.stack(returns[::-1], 1)
        logps, alive = torch.stack(logps, 1), torch.stack(alive, 1)
        adv = (returns - returns.mean()) / (returns.std() + 1e-8)
        entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
        loss = -(logps * adv * alive).sum() / alive.sum().clamp(min=1.0) - 0.01 * entropy
        opt.zero_grad()
        loss.backward()
        opt.step()
        if it % 20 == 0:
            success = (env.pos == env.size - 1).all(1).float().mean().item()
            print(f"iter {it:4d} policy loss {loss.item():8.4f} mean return {returns[:, 0].mean().item():7.3f} "
                  f"success {success:.2f} entropy {entropy.item():.3f}")


if __name__ == "__main__":
    main()
