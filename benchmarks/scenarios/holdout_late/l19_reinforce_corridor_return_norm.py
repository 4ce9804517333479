# expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.div.Tensor", "module": ""}
# about: held out (round late): REINFORCE on a deterministic 5-cell corridor with a -1 per-move reward and returns standardised per batch by (R - mean) / std without epsilon; when the policy has converged, all 16 episodes get the same integer return, std is 0 and the division gives 0/0 = NaN at step 52.
import torch
import torch.nn as nn

torch.manual_seed(4)
torch.set_num_threads(1)

# Tiny deterministic grid world: agent starts at the left end of a corridor of
# length 5 and must walk right to reach the goal; episodes are capped at 50 moves.
# Reward: -1 per move (time penalty), so the return is minus the episode length.
L, MAX_T = 5, 50
N_ACTIONS = 2  # 0 = left, 1 = right


def one_hot(pos):
    s = torch.zeros(L)
    s[pos] = 1.0
    return s


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(L, 32), nn.Tanh(), nn.Linear(32, N_ACTIONS))

    def forward(self, s):
        return torch.distributions.Categorical(logits=self.net(s))


def run_episode(policy):
    pos, logps, total = 0, [], 0.0
    for t in range(MAX_T):
        dist = policy(one_hot(pos))
        a = dist.sample()
        logps.append(dist.log_prob(a))
        new_pos = min(max(pos + (1 if a.item() == 1 else -1), 0), L - 1)
        total -= 1.0
        pos = new_pos
        if pos == L - 1:
            break
    return torch.stack(logps).sum(), total


policy = Policy()
optimizer = torch.optim.Adam(policy.parameters(), lr=0.004)
episodes_per_update = 16

for update in range(200):
    logps, returns = [], []
    for _ in range(episodes_per_update):
        lp, R = run_episode(policy)
        logps.append(lp)
        returns.append(R)
    returns = torch.tensor(returns)
    # standardise returns across the batch of episodes (variance reduction)
    adv = (returns - returns.mean()) / returns.std()
    loss = -(torch.stack(logps) * adv).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if update % 10 == 0:
        print(f"update {update:4d}  mean return {returns.mean().item():.2f}  loss {loss.item():.4f}")
