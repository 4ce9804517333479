# expect: {"healthy": true}
# about: held out (round late): vanilla REINFORCE (no baseline) on a batched hand-written cart-pole; as episodes get longer the summed return-weighted loss grows from ~1e2 to ~5e3, all finite.
import math
import torch
import torch.nn as nn

torch.manual_seed(22)
torch.set_num_threads(1)


class CartPole:
    """Batched classic cart-pole (Barto et al. 1983), Euler integration."""

    def __init__(self, n_envs, max_steps=200):
        self.n, self.max_steps = n_envs, max_steps
        self.g, self.mc, self.mp, self.l, self.f, self.dt = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02

    def reset(self):
        self.state = (torch.rand(self.n, 4) - 0.5) * 0.1
        return self.state.clone()

    def step(self, action):
        x, x_dot, th, th_dot = self.state.unbind(1)
        force = (action.float() * 2 - 1) * self.f
        cos, sin = torch.cos(th), torch.sin(th)
        total_m = self.mc + self.mp
        temp = (force + self.mp * self.l * th_dot ** 2 * sin) / total_m
        th_acc = (self.g * sin - cos * temp) / (self.l * (4.0 / 3.0 - self.mp * cos ** 2 / total_m))
        x_acc = temp - self.mp * self.l * th_acc * cos / total_m
        x = x + self.dt * x_dot
        x_dot = x_dot + self.dt * x_acc
        th = th + self.dt * th_dot
        th_dot = th_dot + self.dt * th_acc
        self.state = torch.stack([x, x_dot, th, th_dot], 1)
        failed = (x.abs() > 2.4) | (th.abs() > 12 * math.pi / 180)
        return self.state.clone(), failed


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))

    def forward(self, s):
        return torch.distributions.Categorical(logits=self.net(s))


n_envs, gamma = 16, 0.99
env = CartPole(n_envs)
policy = Policy()
optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)

for update in range(80):
    s = env.reset()
    alive = torch.ones(n_envs, dtype=torch.bool)
    logps, rewards, masks = [], [], []
    for t in range(env.max_steps):
        dist = policy(s)
        a = dist.sample()
        s, failed = env.step(a)
        logps.append(dist.log_prob(a))
        rewards.append(alive.float())          # +1 for every step the pole is still up
        masks.append(alive.float())
        alive = alive & ~failed
        if not alive.any():
            break
    # discounted reward-to-go
    returns, G = [], torch.zeros(n_envs)
    for r in reversed(rewards):
        G = r + gamma * G
        returns.append(G)
    returns = torch.stack(returns[::-1])          # (T, n_envs)
    logps, masks = torch.stack(logps), torch.stack(masks)
    loss = -(returns * logps * masks).sum() / n_envs      # vanilla REINFORCE, no baseline
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if update % 5 == 0:
        ep_len = masks.sum(0).mean().item()
        print(f"update {update:4d}  mean episode length {ep_len:6.1f}  loss {loss.item():10.2f}")
