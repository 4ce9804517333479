"""A program that never trains (no ``backward()``, no optimizer step) is checked op by op once it
has run a while, under plain ``nanguard run``; its finding names the run of its line, not
"step 0"; a training script whose data is built in a loop goes back to the usual watch at the end
of its first step."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import torch

from _spawn import Spawn
from nanguard.core.finding import Finding
from nanguard.core.render import headline
from nanguard.core.source import SourceLocation
from nanguard.torch._script_calls import LOOP_RUNS, ScriptCalls, ordinal

ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}

# the probability shrinks ×0.3 each iteration and underflows to 0: log(0) = -inf at line 7
ENTROPY = """
    import torch

    p = torch.full((4,), 0.5)
    total = 0.0
    for it in range(500):
        p = p * 0.3
        ent = -(p * torch.log(p)).sum()
        total += float(ent)
    print("total", total)
"""

# a dataset built sample by sample with grad on (line 5 runs 120 times), then training; the
# batch of step 5 holds a NaN
PREP_THEN_TRAIN = """
    import torch, torch.nn as nn
    torch.manual_seed(0)
    rows = []
    for i in range(120):
        x = torch.randn(4)
        rows.append((x - x.mean()) / (x.std() + 1e-6))
    X = torch.stack(rows)
    y = X.sum(1, keepdim=True)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(8):
        xb = X[step * 8:(step + 1) * 8].clone()
        if step == BAD:
            xb[2, 1] = float("nan")
        loss = ((model(xb) - y[step * 8:(step + 1) * 8]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(step, round(loss.item(), 4))
"""


def _first_zero_iteration() -> int:
    """The iteration of ENTROPY whose ``p`` is first exactly 0 (float32 underflow)."""
    p = torch.full((4,), 0.5)
    for it in range(500):
        p = p * 0.3
        if bool((p == 0).all()):
            return it
    raise AssertionError("p never underflows")


def _run(spawn: Spawn, tmp_path: Path, body: str, env: dict[str, str] | None = None,
         *flags: str) -> tuple[object, dict]:  # type: ignore[type-arg]
    (tmp_path / "train.py").write_text(textwrap.dedent(body).lstrip("\n"))
    r = spawn.nanguard("run", *flags, "--json", "log.json", "train.py", cwd=tmp_path,
                       timeout=180, env=env or ENV)
    return r, json.loads((tmp_path / "log.json").read_text())


# --- the counts ----------------------------------------------------------------------------------


def test_the_ops_of_one_run_of_a_line_count_once_and_a_loop_comes_round() -> None:
    calls = ScriptCalls(after=10_000)
    at = SourceLocation("train.py", 7)
    for _ in range(5):  # a line with three ops, run five times: offsets rise within a run
        for offset in (10, 20, 30):
            calls.op((at, offset), grad=True)
    assert calls.lines[("train.py", 7)] == 5 and calls.ops == 15
    one = SourceLocation("train.py", 9)
    for _ in range(4):  # one call making four ops (torch.load), or a loop of one op: unclear
        calls.op((one, 12), grad=True)
    assert calls.lines[("train.py", 9)] == 1 and calls.describe("train.py:9") is None
    assert calls.describe("train.py:7") == "the 5th run of line 7"
    assert calls.describe("train.py:8") is None  # never seen outside a module
    calls.complete = False  # the tape went off for a while: a count could be short
    assert calls.describe("train.py:7") is None


def test_a_loop_without_a_step_is_due_once_at_its_run_and_only_with_grad() -> None:
    due: list[int] = []
    calls = ScriptCalls(after=10_000, on_due=lambda: due.append(calls.ops))
    at = SourceLocation("train.py", 3)
    for _ in range(LOOP_RUNS + 5):  # under no_grad: counted, never due
        calls.op((at, 4), grad=False)
        calls.op((SourceLocation("train.py", 4), 4), grad=False)
    assert due == [] and calls.lines[("train.py", 3)] == LOOP_RUNS + 5
    fresh = ScriptCalls(after=10_000, on_due=lambda: due.append(fresh.ops))
    for _ in range(LOOP_RUNS + 5):  # two lines of a loop
        fresh.op((at, 4), grad=True)
        fresh.op((SourceLocation("train.py", 4), 4), grad=True)
    assert due == [2 * LOOP_RUNS - 1]  # once, at the run that reached the count
    assert fresh.why() == f"train.py:3 ran {LOOP_RUNS} times"
    assert fresh.unchecked_before() == (f"every op from the {2 * LOOP_RUNS - 1}th torch call on (the "
                                        f"{LOOP_RUNS}th run of line 3); the ones before were not "
                                        "checked: nanguard run --trace checks them all")
    many = ScriptCalls(after=3, on_due=lambda: due.append(-1))
    for line in range(5):  # three different lines: the total count
        many.op((SourceLocation("train.py", line), 0), grad=True)
    many.root(grad=True)
    assert due[-1] == -1 and many.why() == "3 torch calls"


def test_ordinals() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 86, 101, 111, 1344)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "86th", "101st",
        "111th", "1,344th"]


def test_a_finding_before_any_step_is_not_called_step_0() -> None:
    f = Finding(op="aten.log.default", phase="forward", step=0)
    assert headline(f) == "the first non-finite value was made in the forward pass at step 0"
    f.details.update(before_training=True, run="the 86th run of line 7")
    assert headline(f) == ("the first non-finite value was made in the forward pass before any "
                           "training step (no backward() or optimizer step had run), in the 86th "
                           "run of line 7")


# --- under nanguard run --------------------------------------------------------------------------


def test_a_forward_only_loop_is_found_at_its_op_line_and_iteration(tmp_path: Path,
                                                                     spawn: Spawn) -> None:
    r, log = _run(spawn, tmp_path, ENTROPY)
    assert r.returncode == 3, r.stderr  # type: ignore[attr-defined]
    (event,) = log["events"]
    run = _first_zero_iteration() + 1
    assert (event["op"], event["phase"], event["source"]) == (
        "aten.log.default", "forward", "train.py:7")
    assert event["cause"] == "unsafe-op"
    assert event["details"]["run"] == f"the {ordinal(run)} run of line 7"
    err = r.stderr  # type: ignore[attr-defined]
    assert err.count("checking every op from here on") == 1 and "NANGUARD_FORWARD_CHECK=0" in err
    assert f"train.py:6 ran {LOOP_RUNS} times and no backward() or optimizer step yet" in err
    assert event["details"]["checked"].startswith("every op from the ")
    assert f"before any training step (no backward() or optimizer step had run), in the " \
           f"{ordinal(run)} run of line 7" in err
    r, log = _run(spawn, tmp_path, ENTROPY, {**ENV, "NANGUARD_FORWARD_CHECK": "0"})
    assert r.returncode == 0 and log["events"] == []  # type: ignore[attr-defined]
    assert "nothing was watched" in log["notes"][0]


def test_a_dataset_built_in_a_loop_goes_back_to_the_watch_when_training_starts(
        tmp_path: Path, spawn: Spawn) -> None:
    healthy = textwrap.dedent(PREP_THEN_TRAIN).lstrip("\n").replace("BAD", "-1")
    (tmp_path / "plain.py").write_text(healthy)
    plain = spawn.python("plain.py", cwd=tmp_path, timeout=180, env=ENV)
    r, log = _run(spawn, tmp_path, healthy)
    assert r.returncode == 0 and r.stdout == plain.stdout  # type: ignore[attr-defined]
    assert log["steps"] == 8 and log["events"] == []
    r, log = _run(spawn, tmp_path, PREP_THEN_TRAIN.replace("BAD", "5"))
    assert r.returncode == 3  # type: ignore[attr-defined]
    (event,) = log["events"]
    # found by the step's watch and its replay (the op-by-op check ended with step 0)
    assert (event["step"], event["phase"], event["detected_by"]) == (5, "data", "replay")
    assert event["cause"] == "nonfinite-input"
    assert "before_training" not in event["details"]


def test_a_dataloader_worker_never_starts_the_check(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A worker (a forked copy of the run) builds batches in a loop and never steps: checking its
    ops would last the whole run, in every worker; the main process's watch sees its batches."""
    import torch.utils.data as tud

    from nanguard.torch.session import TorchSession

    s = TorchSession()
    s.calls = s.guard.recorder.calls = ScriptCalls(on_due=s._forward_only)
    monkeypatch.setattr(tud, "get_worker_info", lambda: object())
    s._forward_only()
    assert s._locator is None and not s.forward_traced
    assert s.calls is None and s.guard.recorder.calls is None


# the dataset of PREP_THEN_TRAIN, then LBFGS: its closure runs the model ~10 times within the
# first optimizer.step(), and that step ends in torch's post-step hooks
PREP_THEN_LBFGS = """
    import torch, torch.nn as nn
    torch.manual_seed(0)
    rows = []
    for i in range(PREP):
        x = torch.randn(4)
        rows.append((x - x.mean()) / (x.std() + 1e-6))
    X = torch.stack(rows)
    y = X.sum(1, keepdim=True)
    model = nn.Linear(4, 1)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=10, line_search_fn="strong_wolfe")
    def closure():
        opt.zero_grad()
        loss = ((model(X) - y) ** 2).mean()
        loss.backward()
        return loss
    for step in range(4):
        print(step, round(float(opt.step(closure)), 4))
"""


def test_a_closure_optimizer_is_training_and_its_first_step_ends_the_check(
        tmp_path: Path, spawn: Spawn) -> None:
    """A closure's runs of the model inside ``optimizer.step(closure)`` are training (a backward()
    ran), not a forward-only loop; a check started by the data loop before ends in torch's
    post-step hook, which must not unregister a hook while torch iterates them."""
    for prep, checked in ((3, False), (120, True)):
        body = textwrap.dedent(PREP_THEN_LBFGS).lstrip("\n").replace("PREP", str(prep))
        (tmp_path / "plain.py").write_text(body)
        plain = spawn.python("plain.py", cwd=tmp_path, timeout=180, env=ENV)
        r, log = _run(spawn, tmp_path, body)
        assert r.returncode == 0, r.stderr  # type: ignore[attr-defined]
        assert r.stdout == plain.stdout  # type: ignore[attr-defined]
        assert log["steps"] == 4 and log["events"] == []
        assert ("checking every op" in r.stderr) is checked  # type: ignore[attr-defined]


def test_an_optimizer_listener_removed_inside_a_step_hook_is_removed_after_it() -> None:
    from nanguard.torch import _autograd

    seen: list[str] = []
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    inner: list[object] = []

    def outer_post(o, a, k):  # type: ignore[no-untyped-def]
        seen.append("outer post")
        if inner:
            inner.pop().remove()  # type: ignore[attr-defined]  # as a first step's end closes a tracer
        else:  # as a replay opens and closes its tracer inside the guard's post-step hook
            _autograd.add_optimizer_listener(lambda o, a, k: None, lambda o, a, k: None).remove()

    # registered first, as the guard's hooks are before a forward-only check's tracer: torch
    # iterates on to the tracer's hook after the guard's removed it
    outer = _autograd.add_optimizer_listener(lambda o, a, k: None, outer_post)
    inner.append(_autograd.add_optimizer_listener(lambda o, a, k: seen.append("inner pre"),
                                                  lambda o, a, k: seen.append("inner post")))
    try:
        model(torch.ones(1, 2)).sum().backward()
        opt.step()  # raised "OrderedDict mutated during iteration" before
        opt.step()
        opt.step()
    finally:
        outer.remove()
    # silent from its removal on, then unregistered once no hook of ours runs
    assert seen == ["inner pre", "outer post", "outer post", "outer post"]
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks
    assert not _global_optimizer_pre_hooks and not _global_optimizer_post_hooks


# the data loop of PREP_THEN_TRAIN, then steps through a closure (as Lightning takes them): the
# first step ends in torch's post-step hook; the loss takes log of a softmax (a latent hazard)
PREP_THEN_CLOSURE = """
    import torch, torch.nn as nn
    torch.manual_seed(0)
    rows = []
    for i in range(120):
        x = torch.randn(4)
        rows.append((x - x.mean()) / (x.std() + 1e-6))
    X, y = torch.stack(rows), torch.randint(0, 3, (120,))
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(6):
        def closure():
            opt.zero_grad()
            p = torch.softmax(model(X[step * 8:(step + 1) * 8]), -1)
            loss = -torch.log(p[torch.arange(8), y[step * 8:(step + 1) * 8]]).mean()
            loss.backward()
            return loss
        opt.step(closure)
"""


def test_the_check_ended_inside_a_step_leaves_no_tape_above_the_next_steps_look(
        tmp_path: Path, spawn: Spawn) -> None:
    """The op-by-op check ends in the post-step hook of a closure's first step: the step
    recorder's tape, pushed below it, went back on the stack there and stood above the hazard
    look of steps 1–2, which then never started (no warning on a Lightning script)."""
    r, log = _run(spawn, tmp_path, PREP_THEN_CLOSURE)
    assert r.returncode == 0, r.stderr  # type: ignore[attr-defined]
    assert "checking every op" in r.stderr  # type: ignore[attr-defined]
    assert [(w["kind"], w["step"]) for w in log["warnings"]] == [("latent-hazard", 2)]
