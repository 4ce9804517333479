# expect: {"healthy": true}
# about: held out (round late): an n-step advantage actor-critic on a hand-written continuing ring-world; as the agent learns to stay on the food the values grow from 0 to ~50 and the critic loss rises ~30x before settling, all finite.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(23)
torch.set_num_threads(1)


class RingForaging:
    """Continuing task: an agent walks on a ring of 12 cells; standing on the food
    cell pays +1 per step. No terminal states, so values approach 1 / (1 - gamma)."""

    def __init__(self, n_envs, size=12, food=7):
        self.n, self.size, self.food = n_envs, size, food
        self.pos = torch.randint(0, size, (n_envs,))

    def obs(self):
        return F.one_hot(self.pos, self.size).float()

    def step(self, action):       # 0: left, 1: stay, 2: right
        self.pos = (self.pos + action - 1) % self.size
        return self.obs(), (self.pos == self.food).float()


class ActorCritic(nn.Module):
    def __init__(self, n_obs, n_actions=3, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_obs, hidden), nn.ReLU())
        self.pi = nn.Linear(hidden, n_actions)
        self.v = nn.Linear(hidden, 1)

    def forward(self, s):
        h = self.body(s)
        return torch.distributions.Categorical(logits=self.pi(h)), self.v(h).squeeze(1)


n_envs, n_steps, gamma = 16, 8, 0.98
env = RingForaging(n_envs)
model = ActorCritic(env.size)
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
s = env.obs()

for update in range(300):
    logps, values, rewards, entropies = [], [], [], []
    for _ in range(n_steps):
        dist, v = model(s)
        a = dist.sample()
        s, r = env.step(a)
        logps.append(dist.log_prob(a))
        values.append(v)
        rewards.append(r)
        entropies.append(dist.entropy())
    with torch.no_grad():
        _, bootstrap = model(s)
    # n-step bootstrapped returns
    R, returns = bootstrap, []
    for r in reversed(rewards):
        R = r + gamma * R
        returns.append(R)
    returns = torch.stack(returns[::-1])
    values, logps = torch.stack(values), torch.stack(logps)
    adv = returns - values
    actor_loss = -(adv.detach() * logps).mean()
    critic_loss = adv.pow(2).mean()
    entropy = torch.stack(entropies).mean()
    loss = actor_loss + 0.5 * critic_loss - 0.01 * entropy
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if update % 20 == 0:
        print(f"update {update:4d}  reward/step {torch.stack(rewards).mean().item():.3f}  "
              f"V {values.mean().item():7.2f}  critic {critic_loss.item():9.3f}  actor {actor_loss.item():8.3f}")
