# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": null}
# about: held out (lr round): batched advantage actor-critic on a hand-written 8-state chain (no_grad rollouts, Gumbel-max sampling), Adam + clip_grad_norm_(0.5) at lr=3e5 instead of a sane 3e-3 (10^8x), the critic's F.mse_loss is inf from step 1 on while clipping zeroes the overflowing grad norm and the policy loss stays finite.
"""Batched advantage actor-critic on a hand-written 1-D chain walk; Adam with grad-norm clipping."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"

N_STATES = 8
MAX_T = 40
N_ENVS = 16
GAMMA = 0.97
UPDATES = 150
LR = 3e-3 if FIXED else 3e5
MAX_GRAD_NORM = 0.5
VALUE_COEF = 0.5
ENTROPY_COEF = 0.01


class ChainEnv:
    """Start at the left end; action 1 moves right, 0 moves left (slip prob 0.1). Reward 1 at the right end."""

    def __init__(self, n_envs):
        self.n = n_envs
        self.pos = torch.zeros(n_envs, dtype=torch.long)

    def reset(self):
        self.pos.zero_()
        return self.obs()

    def obs(self):
        return F.one_hot(self.pos, N_STATES).float()

    def step(self, action):
        move = torch.where(action == 1, 1, -1)
        slip = torch.rand(self.n) < 0.1
        move = torch.where(slip, -move, move)
        self.pos = (self.pos + move).clamp(0, N_STATES - 1)
        done = self.pos == N_STATES - 1
        reward = torch.where(done, torch.tensor(1.0), torch.tensor(0.0))
        return self.obs(), reward, done


class ActorCritic(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(N_STATES, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.pi = nn.Linear(hidden, 2)
        self.v = nn.Linear(hidden, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def gumbel_sample(logits):
    u = torch.rand_like(logits).clamp_(1e-9, 1 - 1e-9)
    return (logits - torch.log(-torch.log(u))).argmax(-1)


def rollout(env, net):
    obs_buf, act_buf, rew_buf, alive_buf = [], [], [], []
    obs = env.reset()
    alive = torch.ones(env.n, dtype=torch.bool)
    with torch.no_grad():
        for _ in range(MAX_T):
            logits, _ = net(obs)
            act = gumbel_sample(logits)
            nxt, rew, done = env.step(act)
            obs_buf.append(obs)
            act_buf.append(act)
            rew_buf.append(rew * alive)
            alive_buf.append(alive.clone())
            alive = alive & ~done
            obs = nxt
            if not alive.any():
                break
    rets, g = [], torch.zeros(env.n)
    for r, a in zip(reversed(rew_buf), reversed(alive_buf)):
        g = r + GAMMA * g * a
        rets.append(g)
    rets.reverse()
    ep_return = torch.stack(rew_buf).sum(0).mean().item()
    mask = torch.stack(alive_buf)
    return (torch.stack(obs_buf)[mask], torch.stack(act_buf)[mask], torch.stack(rets)[mask], ep_return)


def main():
    torch.manual_seed(0)
    env = ChainEnv(N_ENVS)
    net = ActorCritic()
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    returns = []
    for update in range(UPDATES):
        obs, act, ret, ep_ret = rollout(env, net)
        returns.append(ep_ret)
        logits, values = net(obs)
        logp = F.log_softmax(logits, -1)
        adv = (ret - values).detach()
        policy_loss = -(logp.gather(1, act[:, None]).squeeze(1) * adv).mean()
        value_loss = F.mse_loss(values, ret)
        entropy = -(logp.exp() * logp).sum(-1).mean()
        loss = policy_loss + VALUE_COEF * value_loss - ENTROPY_COEF * entropy
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(net.parameters(), MAX_GRAD_NORM)
        opt.step()
        if update % 10 == 0:
            print(f"step {update} loss {policy_loss.item():.4f} value_loss {value_loss.item():.4f} return {ep_ret:.3f}")
    print(f"final return {sum(returns[-10:]) / 10}")
    print(f"final loss {policy_loss.item()}")


if __name__ == "__main__":
    main()
