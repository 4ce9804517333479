# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.pow.Tensor_Scalar", "module": ""}
# about: held out (cure round): one-step continuous-control actor-critic (tanh MLP Gaussian policy with a state-dependent log-std head, MLP value baseline) with two Adam optimizers, the actor at lr=0.3 instead of a sane 3e-3 (100x); the policy std explodes, sampled rewards reach ~1e20 and the critic's squared error overflows to inf at step 4, with everything nan from about step 136.
"""One-step continuous-control actor-critic (Gaussian policy + state-value baseline), two Adam optimizers."""
import argparse
import math
import os

import torch
import torch.nn as nn

torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"


class TargetTask:
    """Contextual continuous bandit: reward = -||a - a*(s)||^2 with a*(s) = tanh(W s)."""

    def __init__(self, obs_dim=6, act_dim=2, seed=31):
        g = torch.Generator().manual_seed(seed)
        self.W = torch.randn(act_dim, obs_dim, generator=g) / math.sqrt(obs_dim) * 2.0
        self.g = torch.Generator().manual_seed(seed + 1)
        self.obs_dim, self.act_dim = obs_dim, act_dim

    def sample_states(self, n, generator=None):
        return torch.randn(n, self.obs_dim, generator=generator or self.g)

    def best_action(self, s):
        return torch.tanh(s @ self.W.T)

    def reward(self, s, a):
        return -((a - self.best_action(s)) ** 2).sum(-1)


class Actor(nn.Module):
    def __init__(self, obs_dim, act_dim, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.mean = nn.Linear(hidden, act_dim)
        self.log_std = nn.Linear(hidden, act_dim)
        nn.init.zeros_(self.log_std.weight)
        nn.init.constant_(self.log_std.bias, -0.5)

    def forward(self, s):
        h = self.body(s)
        return self.mean(h), self.log_std(h)


def gaussian_log_prob(a, mu, log_std):
    var = torch.exp(2 * log_std)
    return (-(a - mu) ** 2 / (2 * var) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


class Critic(nn.Module):
    def __init__(self, obs_dim, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, s):
        return self.net(s).squeeze(-1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=3e-3 if FIXED else 0.3, help="actor learning rate")
    ap.add_argument("--critic-lr", type=float, default=1e-2)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--log-every", type=int, default=50)
    args = ap.parse_args()

    torch.manual_seed(0)
    task = TargetTask()
    actor, critic = Actor(task.obs_dim, task.act_dim), Critic(task.obs_dim)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=args.lr)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=args.critic_lr)
    eval_states = task.sample_states(1024, torch.Generator().manual_seed(777))

    def eval_loss():
        with torch.no_grad():
            mu, _ = actor(eval_states)
            return (-task.reward(eval_states, mu)).mean().item()

    print(f"initial eval loss {eval_loss():.4f}")
    for step in range(args.steps):
        s = task.sample_states(args.batch)
        mu, log_std = actor(s)
        with torch.no_grad():
            a = mu + torch.exp(log_std) * torch.randn_like(mu)
            r = task.reward(s, a)

        value = critic(s)
        critic_loss = ((value - r) ** 2).mean()
        critic_opt.zero_grad()
        critic_loss.backward()
        critic_opt.step()

        adv = (r - value.detach())
        actor_loss = -(gaussian_log_prob(a, mu, log_std) * adv).mean()
        actor_opt.zero_grad()
        actor_loss.backward()
        actor_opt.step()

        if step % args.log_every == 0:
            print(f"step {step} reward {r.mean().item():.4f} actor_loss {actor_loss.item():.4f} "
                  f"critic_loss {critic_loss.item():.4f} std {log_std.exp().mean().item():.4f}")

    print(f"final loss {eval_loss()}")


if __name__ == "__main__":
    main()
