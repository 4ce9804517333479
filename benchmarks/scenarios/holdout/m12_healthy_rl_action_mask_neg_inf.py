# expect: {"healthy": true}
# about: held out (round 4, modern stack): written by someone who had not read the code. HEALTHY control with deliberate -inf. An actor-critic policy for a toy job-to-machine scheduler where only some machines are free: the policy masks illegal actions with logits.masked_fill(~legal, float("-inf")) and samples from Categorical(logits=...); the loss is REINFORCE with a value baseline, an MSE value loss and an entropy bonus (dist.entropy(), which clamps the -inf logits internally), Adam + clip_grad_norm_. The environment also uses a -inf masked_fill to find the best legal machine. Every row has at least one legal action, so the softmax/logsumexp over the masked logits are finite, the illegal actions get probability exactly 0, and no NaN and no non-finite gradient or weight ever appears (checked: the only non-finite values in 120 iterations are the -inf entries the two masked_fill calls put in on purpose). Mean reward rises 0.29 -> ~0.80 and the loss stays finite, so nothing should be reported.
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Categorical

torch.manual_seed(0)
torch.set_num_threads(1)

N_ACT, OBS = 12, 16


class ToyScheduler:
    """each step: a job (obs) and a set of free machines (legal actions); reward = how well the
    chosen machine matches the job, only legal machines can be chosen"""

    def __init__(self, batch):
        self.batch = batch
        self.affinity = torch.randn(OBS, N_ACT)

    def reset(self):
        self.obs = torch.randn(self.batch, OBS)
        legal = torch.rand(self.batch, N_ACT) < 0.4
        legal[torch.arange(self.batch), torch.randint(0, N_ACT, (self.batch,))] = True  # at least one free
        self.legal = legal
        return self.obs, self.legal

    def step(self, action):
        score = self.obs @ self.affinity
        best = score.masked_fill(~self.legal, float("-inf")).max(1).values
        return (score.gather(1, action[:, None]).squeeze(1) - best).exp()   # 1 for the best legal machine


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(OBS, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.pi = nn.Linear(64, N_ACT)
        self.v = nn.Linear(64, 1)

    def forward(self, obs, legal):
        h = self.trunk(obs)
        logits = self.pi(h).masked_fill(~legal, float("-inf"))     # illegal actions get probability 0
        return Categorical(logits=logits), self.v(h).squeeze(-1)


env = ToyScheduler(batch=256)
policy = Policy()
opt = torch.optim.Adam(policy.parameters(), lr=3e-3)
for it in range(120):
    obs, legal = env.reset()
    dist, value = policy(obs, legal)
    action = dist.sample()
    reward = env.step(action)
    adv = (reward - value).detach()
    loss = -(dist.log_prob(action) * adv).mean() + 0.5 * F.mse_loss(value, reward) - 0.01 * dist.entropy().mean()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    opt.step()
    if it % 20 == 0 or it == 119:
        print(f"iter {it:3d} mean reward {reward.mean().item():.3f} entropy {dist.entropy().mean().item():.3f} loss {loss.item():.4f}")
