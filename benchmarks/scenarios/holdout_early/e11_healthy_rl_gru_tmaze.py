# expect: {"healthy": true}
# about: held out (round early): A recurrent actor-critic policy (GRUCell stepped through each episode) is trained with REINFORCE plus a learned value baseline on a batched T-maze whose cue is only visible at the first step; every value stays finite, the return rises and the loss goes down.
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.set_num_threads(1)

CORRIDOR, MAX_T, N_ENV = 4, 10, 64


class TMaze:
    """Batched T-maze: walk forward to the junction, then turn towards the side shown by the initial cue."""

    def reset(self, n):
        self.n = n
        self.cue = torch.randint(0, 2, (n,))
        self.pos = torch.zeros(n, dtype=torch.long)
        self.done = torch.zeros(n, dtype=torch.bool)
        self.t = 0
        return self.obs()

    def obs(self):
        o = torch.zeros(self.n, 3)
        if self.t == 0:
            o[torch.arange(self.n), self.cue] = 1.0
        o[:, 2] = (self.pos == CORRIDOR).float()
        return o

    def step(self, a):
        r = torch.zeros(self.n)
        at_junction = self.pos == CORRIDOR
        fwd = (a == 0) & ~at_junction
        self.pos = self.pos + fwd.long()
        bump = ((a != 0) & ~at_junction) | ((a == 0) & at_junction)
        r = r - 0.1 * bump.float()
        turn = (a != 0) & at_junction
        correct = turn & ((a - 1) == self.cue)
        r = r + 1.0 * correct.float() - 0.4 * (turn & ~correct).float()
        r = r * (~self.done).float()
        self.done = self.done | turn
        self.t += 1
        return self.obs(), r, self.done.clone()


class RecurrentActorCritic(nn.Module):
    def __init__(self, hid=32):
        super().__init__()
        self.inp = nn.Linear(3, hid)
        self.core = nn.GRUCell(hid, hid)
        self.pi = nn.Linear(hid, 3)
        self.v = nn.Linear(hid, 1)

    def forward(self, o, h):
        h = self.core(torch.relu(self.inp(o)), h)
        return self.pi(h), self.v(h).squeeze(1), h


env = TMaze()
agent = RecurrentActorCritic()
opt = torch.optim.Adam(agent.parameters(), lr=1e-2)
GAMMA = 0.98

for update in range(100):
    o = env.reset(N_ENV)
    h = torch.zeros(N_ENV, 32)
    logps, values, rewards, alive, ents = [], [], [], [], []
    for t in range(MAX_T):
        logits, v, h = agent(o, h)
        dist = torch.distributions.Categorical(logits=logits)
        a = dist.sample()
        alive.append((~env.done).float())
        logps.append(dist.log_prob(a))
        ents.append(dist.entropy())
        values.append(v)
        o, r, done = env.step(a)
        rewards.append(r)
    # discounted returns, computed backwards through the episode
    ret = torch.zeros(N_ENV)
    returns = []
    for r in reversed(rewards):
        ret = r + GAMMA * ret
        returns.insert(0, ret)
    returns, logps, values = torch.stack(returns, 1), torch.stack(logps, 1), torch.stack(values, 1)
    alive, ents = torch.stack(alive, 1), torch.stack(ents, 1)
    adv = (returns - values).detach()
    n_alive = alive.sum()
    policy_loss = -(logps * adv * alive).sum() / n_alive
    value_loss = ((returns - values) ** 2 * alive).sum() / n_alive
    entropy = (ents * alive).sum() / n_alive
    loss = policy_loss + 0.5 * value_loss - 0.01 * entropy
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(agent.parameters(), 5.0)
    opt.step()
    if update % 5 == 0 or update == 99:
        print(f"update {update:3d} loss {loss.item():.4f} value-loss {value_loss.item():.4f} "
              f"mean return {torch.stack(rewards, 1).sum(1).mean().item():.3f}")
