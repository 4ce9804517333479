"""A run with two optimizers (an actor-critic: the critic steps first, the actor's graph is still
alive when the critic's step fails) under ``recover``: the rollback restores both models and
both optimizers' state, the actor's stale update is skipped, and each optimizer's learning rate
is backed off from its own value and given back after its step. The fault is the actor's
learning rate (0.5 for Adam): deterministic under the seed."""

from __future__ import annotations

import torch
from torch import nn

import nanguard


def _actor_critic(actor_lr: float, iters: int) -> tuple[nanguard.Guard, torch.optim.Optimizer,
                                                         torch.optim.Optimizer, nn.Module]:
    torch.manual_seed(0)
    w = torch.randn(2, 4)
    actor = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 4))  # mean and log-std
    critic = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1))
    oc = torch.optim.Adam(critic.parameters(), lr=0.01)
    oa = torch.optim.Adam(actor.parameters(), lr=actor_lr)
    with nanguard.attach(policy="recover") as guard:
        for _ in range(iters):
            s = torch.randn(64, 4)
            mu, log_std = actor(s).chunk(2, -1)  # the actor's graph, alive until its backward
            with torch.no_grad():
                a = mu + log_std.exp() * torch.randn_like(mu)
                r = -((a - torch.tanh(s @ w.T)) ** 2).sum(-1)
            v = critic(s).squeeze(-1)
            closs = ((v - r) ** 2).mean()
            oc.zero_grad()
            closs.backward()
            oc.step()
            logp = (-(a - mu) ** 2 / (2 * (2 * log_std).exp()) - log_std).sum(-1)
            aloss = -(logp * (r - v.detach())).mean()
            oa.zero_grad()
            aloss.backward()
            oa.step()
    return guard, oc, oa, actor


def test_a_rollback_at_the_critics_step_restores_the_actor_too_and_skips_its_stale_update() -> None:
    guard, oc, oa, actor = _actor_critic(0.5, 30)
    (rec,) = guard.recoveries  # one rollback cured it: the actor's weights were restored with the critic's
    assert rec["step"] == 36 and rec["action"] == "rollback" and rec["verified"] is True
    assert rec["cause"] == "learning-rate-too-high" and rec["lr_factor"] == 0.29
    by_step = {r.step: r for r in guard.history}
    # the actor's graph was built on the weights the rollback replaced: its update is skipped
    # (and its backward did not raise on a modified tensor)
    assert by_step[37].optimizer == "Adam[1]" and by_step[37].event == "stale" and by_step[37].skipped
    assert all(torch.isfinite(p).all() for p in actor.parameters())
    # each optimizer backed off from its own learning rate, never compounded nor swapped
    after = [r for r in guard.history if r.step > 37]
    assert {r.lr for r in after if r.optimizer == "Adam[0]"} == {0.01 * 0.29}
    assert {r.lr for r in after if r.optimizer == "Adam[1]"} == {0.5 * 0.29}
    # and given back after each step: the script's own values are what it reads
    assert oc.param_groups[0]["lr"] == 0.01 and oa.param_groups[0]["lr"] == 0.5


def test_a_hand_written_update_keeps_recent_snapshots_and_rolls_back_to_one() -> None:
    """No optimizer (``p -= lr * p.grad``): snapshots are renewed every ``snapshot_every`` steps
    at the check before the update, so a rollback at step 50 loses the steps since the last
    one, not the whole run (before, the only snapshot of such a run was the one of step 0)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    x = torch.randn(256, 4)
    y = x.sum(1, keepdim=True)
    lr = 0.05
    with nanguard.attach(policy="recover", snapshot_every=20) as guard:
        for step in range(56):
            loss = ((model(x) - y) ** 2).mean()
            model.zero_grad()
            loss.backward()
            if step == 50:
                lr = 40.0  # a schedule gone wrong: the next updates blow the weights up
            with torch.no_grad():
                for p in model.parameters():
                    p -= lr * p.grad
    rec = guard.recoveries[0]
    assert rec["action"] == "rollback" and rec["cause"] == "learning-rate-too-high"
    assert rec["restored_step"] == 40 and rec["steps_lost"] < 20
    assert all(torch.isfinite(p).all() for p in model.parameters())
