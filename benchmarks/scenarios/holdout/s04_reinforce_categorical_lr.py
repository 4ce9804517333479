# expect: {"cause": "learning-rate-too-high", "phase": "forward", "op": "aten.mse_loss.default", "module": null}
# about: held out: written after the suite by someone who had not read it. REINFORCE with a learned baseline (actor-critic, shared trunk) on a toy bandit-like
# REINFORCE with a learned baseline (actor-critic, shared trunk) on a toy bandit-like
# environment: 4 actions, the reward depends on the state. Returns are NOT normalised,
# and the learning rate was "tuned" on a different reward scale.
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical

torch.manual_seed(0)
OBS, ACT = 6, 4


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(OBS, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.pi = nn.Linear(64, ACT)
        self.v = nn.Linear(64, 1)

    def forward(self, obs):
        h = self.trunk(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def env_step(obs, action):
    # reward in the tens; the "good" action is argmax of the first 4 features
    good = obs[:, :ACT].argmax(-1)
    return torch.where(action == good, 10.0, -1.0) + obs[:, 4] * 5.0


net = ActorCritic()
opt = torch.optim.SGD(net.parameters(), lr=0.2)
for episode in range(200):
    obs = torch.randn(32, OBS) * 2
    logits, value = net(obs)
    dist = Categorical(logits=logits)
    action = dist.sample()
    ret = env_step(obs, action)
    adv = ret - value.detach()
    policy_loss = -(dist.log_prob(action) * adv).mean()
    value_loss = F.mse_loss(value, ret)
    loss = policy_loss + 0.5 * value_loss - 0.01 * dist.entropy().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if episode % 10 == 0:
        print(f"episode {episode} return {ret.mean().item():.2f} loss {loss.item():.3f}")
