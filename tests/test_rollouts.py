"""Forwards that build no graph (an RL rollout, an evaluation loop) between optimizer steps: the
recorder keeps the first, stands aside for the rest, and a failure in the update is still caught
at its op — and an evaluation under ``torch.inference_mode`` leaves torch's dispatch state sound.
A rollout *with* grad (reinforce.py) goes lean after a few forwards; a non-finite loss of such a
step is then found in its autograd graph."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nanguard
from nanguard import Cause, NonFiniteError
from nanguard.torch._recorder import RootCall


def _policy() -> nn.Module:
    return nn.Sequential(OrderedDict(fc1=nn.Linear(4, 32), act=nn.Tanh(), fc2=nn.Linear(32, 2)))


def _rollout(policy: nn.Module, n: int) -> torch.Tensor:
    """n environment steps, one small forward each, under no_grad; the observations it saw."""
    obs, seen = torch.zeros(4), []
    with torch.no_grad():
        for _ in range(n):
            probs = torch.softmax(policy(obs), dim=-1)
            a = int(torch.multinomial(probs, 1))
            seen.append(obs)
            obs = torch.tanh(obs + (0.1 if a else -0.1) + 0.05 * torch.randn(4))
    return torch.stack(seen)


def _update(policy: nn.Module, opt: torch.optim.Optimizer, obs: torch.Tensor,
            returns: torch.Tensor) -> None:
    logp = torch.log_softmax(policy(obs), dim=-1)[:, 0]
    opt.zero_grad()
    (-(logp * returns).mean()).backward()
    opt.step()


def test_a_rollout_records_one_forward_and_the_update_is_recorded_whole() -> None:
    torch.manual_seed(0)
    policy = _policy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    with nanguard.attach(policy, opt) as guard:
        for _ in range(3):
            obs = _rollout(policy, 50)
            roots = [e for e in guard.recorder.events if isinstance(e, RootCall)]
            assert len(roots) == 1 and not roots[0].grad_enabled  # the first of 50, not all
            _update(policy, opt, obs, torch.randn(len(obs)))
    assert guard.findings == []


def _failing_after_rollout(make_returns_after_forward: bool) -> NonFiniteError:
    torch.manual_seed(0)
    policy = _policy()
    opt = torch.optim.SGD(policy.parameters(), lr=1e-2)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(policy, opt):
        for it in range(3):
            obs = _rollout(policy, 40)
            if make_returns_after_forward:  # the update's forward re-arms the recorder first
                logp = torch.log_softmax(policy(obs), dim=-1)[:, 0]
                returns = torch.randn(len(obs))
                if it == 2:
                    returns = torch.log(returns - returns)  # log(0): the returns are -inf
                opt.zero_grad()
                (-(logp * returns).mean()).backward()
                opt.step()
                continue
            returns = torch.randn(len(obs))
            if it == 2:
                returns = torch.log(returns - returns)
            _update(policy, opt, obs, returns)
    return info.value


def test_a_failure_after_the_update_forward_is_caught_at_its_op() -> None:
    f = _failing_after_rollout(True).finding
    assert (f.op, f.phase, f.step) == ("aten.log.default", "forward", 2)
    assert "returns = torch.log(returns - returns)" in str(f.source_code)


def test_a_tensor_built_during_a_rollout_is_not_called_loaded_data() -> None:
    """Between the rollout's no_grad forwards and the update's forward nothing is recorded (that
    is what keeps a rollout cheap): the finding says where the tensor entered and that the
    script built it — not 'clean your data file'."""
    err = _failing_after_rollout(False)
    f, d = err.finding, err.diagnosis
    assert (f.op, f.phase, f.step, f.details["origin"]) == ("input", "data", 2, "unrecorded")
    assert d is not None and d.cause is Cause.NONFINITE_INPUT
    assert d.summary.startswith("a tensor the script built in this step holds")
    assert any("--trace" in fix for fix in d.fixes) and not any("dropna" in fix for fix in d.fixes)


def test_a_loaded_batch_after_a_rollout_is_still_data() -> None:
    torch.manual_seed(0)
    policy = _policy()
    opt = torch.optim.SGD(policy.parameters(), lr=1e-2)
    x = torch.randn(48, 4)
    x[37, 1] = float("nan")
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.randn(48)), batch_size=16)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(policy, opt):
        for xb, rb in loader:
            _rollout(policy, 20)
            _update(policy, opt, xb, rb)
    f = info.value.finding
    assert (f.op, f.phase, f.step, f.details["origin"]) == ("input", "data", 2, "data")


def test_an_evaluation_under_inference_mode_leaves_no_stale_dispatch_key() -> None:
    """inference_mode restores the whole dispatch-key set when it exits: the tape must be
    on exactly as it was at its entry, or the next factory call meets torch's INTERNAL ASSERT
    ("Hit Python dispatch key but no arguments had PyInterpreter")."""
    torch.manual_seed(0)
    policy = _policy()
    opt = torch.optim.SGD(policy.parameters(), lr=1e-2)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))

    @torch.inference_mode()
    def evaluate() -> float:
        losses = []
        for x, y in torch.utils.data.DataLoader(data, batch_size=16):
            losses.append(F.cross_entropy(policy(x), y).item())
        return sum(losses) / len(losses)

    with nanguard.attach(policy, opt) as guard:
        for _ in range(3):
            x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))
            opt.zero_grad()
            F.cross_entropy(policy(x), y).backward()
            opt.step()
            evaluate()
            evaluate()  # a DataLoader made after the first evaluation: torch.empty inside
            assert torch.empty(()).shape == ()
    assert guard.findings == []


def _grad_rollout(policy: nn.Module, n: int) -> torch.Tensor:
    """REINFORCE as pytorch/examples writes it: a forward *with* grad per environment step, a
    Categorical sample, its log-prob kept for the update (a dozen ops outside modules each)."""
    obs, logps = torch.zeros(4), []
    for _ in range(n):
        dist = torch.distributions.Categorical(probs=torch.softmax(policy(obs), dim=-1))
        a = dist.sample()
        logps.append(dist.log_prob(a))
        obs = torch.tanh(obs + (0.1 if int(a) else -0.1) + 0.05 * torch.randn(4))
    return torch.stack(logps)


def test_a_full_tape_stands_aside_for_the_rest_of_the_step_and_the_next_records_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from nanguard.torch import _recorder

    monkeypatch.setattr(_recorder, "LEAN_AFTER", 10**9)  # the tape fills before a lean step
    torch.manual_seed(0)
    policy = _policy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    with nanguard.attach(policy, opt) as guard:
        rec = guard.recorder
        rec.max_events = 200
        taped = _count_taped(monkeypatch)
        logps = _grad_rollout(policy, 5)  # fits in the tape
        assert not rec.truncated and not rec.stood_aside
        small = len(taped)
        logps = torch.cat([logps, _grad_rollout(policy, 100)])
        assert rec.truncated and rec.stood_aside and len(rec.events) == 200
        # once full, ops pass until the next model call pops the tape, which stays off
        assert not rec._tape_on and torch._C._len_torch_dispatch_stack() == 0
        assert len(taped) < 200 + 3 * small
        opt.zero_grad()
        (-logps.sum()).backward()
        opt.step()
        assert guard.findings == [] and not rec.truncated and rec._tape_on  # the next step
        _grad_rollout(policy, 2)
        assert any(isinstance(e, RootCall) and e.grad_enabled for e in rec.events)


def _count_taped(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    from nanguard.torch import _recorder

    taped: list[int] = []
    orig = _recorder._Tape.__torch_dispatch__

    def counting(self: _recorder._Tape, func: object, types: object, args: object = (),
                 kwargs: object = None) -> object:
        taped.append(1)
        return orig(self, func, types, args, kwargs)

    monkeypatch.setattr(_recorder._Tape, "__torch_dispatch__", counting)
    return taped


def test_a_rollout_with_grad_goes_lean_and_the_next_step_records_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from nanguard.torch._recorder import LEAN_AFTER, Backward

    torch.manual_seed(0)
    policy = _policy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    with nanguard.attach(policy, opt) as guard:
        rec = guard.recorder
        taped = _count_taped(monkeypatch)
        for _ in range(3):
            logps = _grad_rollout(policy, 200)
            roots = [e for e in rec.events if isinstance(e, RootCall)]
            assert rec.lean and rec.stood_aside and not rec.truncated
            assert len(roots) == LEAN_AFTER - 1 and all(r.grad_enabled for r in roots)
            opt.zero_grad()
            (-logps.sum()).backward()
            assert not any(isinstance(e, Backward) for e in rec.events)  # no replay of its loss
            opt.step()
            assert not rec.lean and rec._tape_on  # the next step records again
        # the ops of LEAN_AFTER forwards are taped per step (~40 ops each), not those of 200
        assert 0 < len(taped) < 3 * 60 * LEAN_AFTER
    assert guard.findings == []


def test_a_recurrence_stays_recorded_however_long() -> None:
    """An RNN cell fed its own hidden state (or a decoder its last output) is one computation,
    not a rollout: every call is on the tape."""
    torch.manual_seed(0)
    cell = nn.GRUCell(4, 8)
    opt = torch.optim.SGD(cell.parameters(), lr=1e-2)
    with nanguard.attach(cell, opt) as guard:
        for _ in range(2):
            h = torch.zeros(1, 8)
            for _ in range(30):
                h = cell(torch.randn(1, 4), h)
            roots = [e for e in guard.recorder.events if isinstance(e, RootCall)]
            assert not guard.recorder.lean and len(roots) == 30
            opt.zero_grad()
            h.pow(2).mean().backward()
            opt.step()
    assert guard.findings == []


def _failing_grad_rollout(n: int, fault: str) -> NonFiniteError:
    """REINFORCE with grad: at environment step 3n/4 of the third update, the script's own
    ``log`` of a zero probability, or a NaN reward in its returns."""
    torch.manual_seed(0)
    policy = _policy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(policy, opt):
        for it in range(3):
            obs, logps, rewards = torch.zeros(4), [], []
            for t in range(n):
                probs = torch.softmax(policy(obs), dim=-1)
                dist = torch.distributions.Categorical(probs=probs)
                a = dist.sample()
                lp = dist.log_prob(a)
                if it == 2 and t == 3 * n // 4 and fault == "log0":
                    lp = torch.log(probs[a] * 0)
                logps.append(lp)
                rewards.append(float("nan") if it == 2 and t == 3 * n // 4 and fault == "reward" else 1.0)
                obs = torch.tanh(obs + (0.1 if int(a) else -0.1) + 0.05 * torch.randn(4))
            returns = torch.tensor(rewards).cumsum(0).flip(0)
            returns = (returns - returns.mean()) / (returns.std() + 1e-8)
            opt.zero_grad()
            (-(torch.stack(logps) * returns).sum()).backward()
            opt.step()
    return info.value


def test_a_log_of_zero_in_a_lean_rollout_is_found_in_the_graph() -> None:
    err = _failing_grad_rollout(200, "log0")
    f, d = err.finding, err.diagnosis
    assert (f.op, f.phase, f.step, f.grad_fn, f.detected_by) == ("aten.log", "forward", 2, "LogBackward0", "graph")
    assert f.reached == "loss" and f.neginf == 1 and f.inputs[0].zeros == 1
    assert f.module is None and "not known" in f.where  # the graph keeps no module: not claimed
    assert d is not None and d.cause is Cause.UNSAFE_OP


def test_a_nan_reward_in_a_lean_rollout_is_a_tensor_the_script_built() -> None:
    err = _failing_grad_rollout(200, "reward")
    f, d = err.finding, err.diagnosis
    assert (f.op, f.phase, f.step, f.detected_by, f.details["origin"]) == ("input", "data", 2, "graph", "unrecorded")
    assert d is not None and d.cause is Cause.NONFINITE_INPUT
    assert not any("dropna" in fix for fix in d.fixes)


def test_a_short_rollout_with_grad_is_replayed_to_its_line() -> None:
    """Below LEAN_AFTER forwards the step is recorded whole: the replay names the line."""
    err = _failing_grad_rollout(3, "log0")
    f = err.finding
    assert (f.op, f.phase, f.step, f.detected_by) == ("aten.log.default", "forward", 2, "replay")
    assert "torch.log(probs[a] * 0)" in str(f.source_code)


def test_a_non_finite_loss_is_the_finding_when_no_replay_runs() -> None:
    """The watch's own finding, without a replay: a loss that is not finite was made in the
    forward pass, whatever its NaN gradients look like afterwards."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with pytest.raises(NonFiniteError) as info, nanguard.attach(model, opt, replay=False):
        for it in range(3):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            (loss.log() - loss.log() if it < 2 else torch.log(loss * 0)).backward()
            opt.step()
    f = info.value.finding
    assert (f.phase, f.reached, f.step, f.detected_by) == ("forward", "loss", 2, "watch")


def test_a_long_loop_under_inference_mode_leaves_torch_working() -> None:
    """Leaving ``inference_mode`` restores the dispatch keys of its entry: a tape pushed then and
    popped inside (a model call after the tape filled) left torch's Python key on with no mode,
    and the script's next op — printing a tensor — failed an internal assert of torch."""
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = nanguard.attach(model, opt)

    @torch.inference_mode()
    def sample(x: torch.Tensor) -> torch.Tensor:
        for _ in range(300):
            x = x + 0.5 * (model(x) - x) + 0.1 * torch.randn_like(x)
        return x

    try:
        x, sigma = torch.randn(32, 4), torch.tensor(1.0)
        with torch.inference_mode():
            for _ in range(700):  # ~6 ops outside the model a call: the tape fills (4096)
                x = x + 0.5 * sigma ** 2 * (model(x) - x) + 0.1 * sigma * torch.randn_like(x)
                sigma = sigma * 0.99
        assert repr(x.mean(0)).startswith("tensor([")
        assert repr(sample(torch.randn(8, 4)).mean(0)).startswith("tensor([")
        loss = model(torch.randn(8, 4)).pow(2).mean()  # training goes on, watched
        opt.zero_grad()
        loss.backward()
        opt.step()
    finally:
        guard.detach()
    assert guard.step == 1 and not guard.findings
