# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.div.Tensor", "module": ""}
# about: held out (round late 2): REINFORCE policy MLP on a contextual bandit with 0/1 rewards normalised as (r - mean) / std without eps; as the policy improves the reward std shrinks, and at step 262 every action in the batch is correct, std is exactly 0 and the division gives NaN.
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--batch", type=int, default=16)
args = parser.parse_args()

torch.manual_seed(6)

N_ARMS, CTX = 5, 8
# hidden linear preference model of the environment: best arm = argmax(A @ context)
A = torch.randn(N_ARMS, CTX)


def env_step(ctx, actions):
    best = (ctx @ A.T).argmax(-1)
    return (actions == best).float()  # reward 1 for the right recommendation, 0 otherwise


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(CTX, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.logits = nn.Linear(64, N_ARMS)

    def forward(self, ctx):
        return self.logits(self.body(ctx))


def sample_actions(logits):
    # inverse-CDF sampling, vectorised over the batch
    probs = torch.softmax(logits, -1)
    u = torch.rand(logits.shape[0], 1)
    return (probs.cumsum(-1) < u).sum(-1).clamp(max=N_ARMS - 1)


policy = Policy()
opt = torch.optim.Adam(policy.parameters(), lr=args.lr)

for step in range(args.steps):
    ctx = torch.randn(args.batch, CTX)
    logits = policy(ctx)
    with torch.no_grad():
        actions = sample_actions(logits)
    rewards = env_step(ctx, actions)
    # normalise the rewards into advantages (standard variance-reduction trick)
    adv = (rewards - rewards.mean()) / rewards.std()
    logp = torch.log_softmax(logits, -1).gather(1, actions[:, None]).squeeze(1)
    loss = -(logp * adv).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 25 == 0:
        print(f"step {step:4d}  avg reward {rewards.mean().item():.3f}  loss {loss.item():.4f}")

print(f"final loss {loss.item():.4f}")
