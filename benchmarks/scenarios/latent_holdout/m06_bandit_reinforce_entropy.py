"""Contextual-bandit recommender: a policy MLP picks one of 12 items per user context and is
trained with REINFORCE (running-mean baseline) plus an entropy bonus to keep exploring.
Latent hazard (line 29): policy_loss() computes -(probs * torch.log(probs)) with grad and no clamp; a
probability of 0 gives 0 * -inf = NaN, but in 200 steps the smallest is ~1e-7."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

N_ITEMS = 12
CTX_DIM = 10


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(CTX_DIM, 64)
        self.fc2 = nn.Linear(64, N_ITEMS)

    def forward(self, ctx):
        return self.fc2(F.relu(self.fc1(ctx)))


def policy_loss(logits, actions, advantages, beta):
    probs = F.softmax(logits, dim=-1)
    logp_all = F.log_softmax(logits, dim=-1)
    logp = logp_all.gather(1, actions.unsqueeze(1)).squeeze(1)
    entropy = -(probs * torch.log(probs)).sum(-1)
    return -(advantages * logp).mean() - beta * entropy.mean(), entropy.mean()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--beta", type=float, default=0.01)
    args = ap.parse_args()

    torch.manual_seed(0)
    user_taste = torch.randn(CTX_DIM, N_ITEMS) / CTX_DIM ** 0.5
    policy = Policy()
    opt = torch.optim.RMSprop(policy.parameters(), lr=1e-3)
    baseline = 0.0

    for step in range(args.steps):
        ctx = torch.randn(256, CTX_DIM)
        logits = policy(ctx)
        with torch.no_grad():
            actions = torch.multinomial(F.softmax(logits, -1), 1).squeeze(1)
            click_p = torch.sigmoid(3.0 * (ctx @ user_taste)).gather(1, actions.unsqueeze(1)).squeeze(1)
            reward = torch.bernoulli(click_p)
        baseline = 0.9 * baseline + 0.1 * reward.mean().item()
        adv = reward - baseline

        loss, ent = policy_loss(logits, actions, adv, args.beta)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f} reward {reward.mean().item():.3f} entropy {ent.item():.3f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
