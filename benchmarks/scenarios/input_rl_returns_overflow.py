# expect: {"cause": "nonfinite-input", "phase": "data", "op": "input", "module": null}
# about: REINFORCE on a cliff walk whose fall penalty is -1e308; the discounted return R = r + gamma * R overflows to -inf as a Python float and torch.tensor(returns) carries it in.
import os

import torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
FIXED = os.environ.get("NANGUARD_SCENARIO_FIXED") == "1"  # the hand-fixed version (benchmarks/recovery.py)

N_STATES = 9
FALL_PENALTY = -100.0 if FIXED else -1e308  # "as bad as it gets"; fixed: a finite penalty
GAMMA = 0.99


def run_episode(policy, length=20):
    pos, log_probs, rewards = 0, [], []
    for _ in range(length):
        state = torch.nn.functional.one_hot(torch.tensor(pos), N_STATES).float()
        dist = torch.distributions.Categorical(logits=policy(state))
        action = dist.sample()
        log_probs.append(dist.log_prob(action))
        if action.item() == 0:
            pos += 1
            reward = 1.0 if pos < N_STATES - 1 else 10.0
        elif pos >= 6:
            reward = FALL_PENALTY  # stepped off the cliff edge
            pos = 0
        else:
            reward = -1.0  # slipped back to the start
            pos = 0
        if pos >= N_STATES - 1:
            pos = 0
        rewards.append(reward)
    return log_probs, rewards


def main():
    policy = nn.Sequential(nn.Linear(N_STATES, 32), nn.Tanh(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    for episode in range(40):
        log_probs, rewards = run_episode(policy)
        returns, R = [], 0.0
        for r in reversed(rewards):
            R = r + GAMMA * R
            returns.insert(0, R)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + 1e-8)
        loss = -(torch.stack(log_probs) * returns).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if episode % 5 == 0:
            print(f"episode {episode} loss {loss.item():.3f} return {sum(rewards):.3g}")
    print(f"final loss {loss.item():.6g}")


if __name__ == "__main__":
    main()
