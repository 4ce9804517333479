"""The guarantee of ``skip`` and ``recover`` over the whole scenario suite, end to end.

"Under ``skip`` or ``recover``, no parameter or optimizer-state tensor ever holds a non-finite value
after a step." Every failing scenario of ``benchmarks/scenarios`` runs under ``nanguard run`` with
``NANGUARD_VERIFY=1``, which checks the weights and the optimizer state after every step and
writes the verdict to the run log's ``notes``. A run that stops with the diagnosis (exit 3) is
fine — the check is about the steps that were taken — and so is one that finished without its loss
coming back (exit 4); a run that ends any other way than exit 0, 3 or 4 is not. The runs go through the functions of ``benchmarks/recovery.py``.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

# the whole module is in the end-to-end tier: its runs of `nanguard run` in fresh processes are
# started by benchmarks/recovery.py, not by the `spawn` fixture that marks the other such tests
pytestmark = pytest.mark.slow

_RECOVERY = Path(__file__).resolve().parent.parent / "benchmarks" / "recovery.py"
_spec = importlib.util.spec_from_file_location("nanguard_bench_recovery", _RECOVERY)
assert _spec is not None and _spec.loader is not None
recovery = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = recovery
_spec.loader.exec_module(recovery)

_FAILING = [s for s in recovery.diagnose.discover() if not s.expect.healthy]
_BY_NAME = {s.name: s for s in _FAILING}

#: one scenario per kind of outcome under ``recover``; each runs in a few seconds
DROP_BATCH = "input_csv_empty_cell"  # nonfinite-input → drop the batch, finish
ROLLBACK = "lr_sgd_lr10_mlp"  # learning-rate-too-high → roll back + back off, finish
UNSAFE = "unsafe_log_sigmoid_bce"  # unsafe-op → no blind fix: stop with the diagnosis


def _explain(run: recovery.GuardedRun) -> str:
    lines = [
        f"{run.name} (--policy {run.policy}): exit {run.exit_code}, status {run.status}, "
        f"cause {run.cause}, steps {run.steps}, did: {run.actions}"
    ]
    lines += [f"  note: {n}" for n in run.notes[:5]]
    if run.error:
        lines.append(f"  error: {run.error}")
        lines.append("  stderr: " + run.stderr_tail[-600:])
    return "\n".join(lines)


def _guarantee_failures(runs: list[recovery.GuardedRun]) -> list[str]:
    bad = []
    for run in runs:
        if run.error is not None or run.exit_code not in (recovery.EXIT_OK, recovery.EXIT_NONFINITE,
                                                          recovery.EXIT_NOT_RECOVERED):
            bad.append("crashed: " + _explain(run))
        elif run.verify is not True:
            why = "guarantee violated" if run.verify is False else "no verify note"
            bad.append(f"{why}: " + _explain(run))
    return bad


# --- fast: one drop_batch, one rollback, one stop ------------------------------------------------


@pytest.fixture(scope="module")
def fast_runs() -> dict[str, recovery.GuardedRun]:
    rows = recovery.run_all([_BY_NAME[n] for n in (DROP_BATCH, ROLLBACK, UNSAFE)],
                            policy="recover", fixed=False)
    return {r.scenario.name: r.guarded for r in rows}


def test_the_fast_scenarios_have_their_labels() -> None:
    assert _BY_NAME[DROP_BATCH].expect.cause == "nonfinite-input"
    assert _BY_NAME[ROLLBACK].expect.cause == "learning-rate-too-high"
    assert _BY_NAME[UNSAFE].expect.cause == "unsafe-op"
    assert len(_FAILING) >= 25


def test_recover_drops_a_poisoned_batch_and_finishes(fast_runs: dict[str, recovery.GuardedRun]) -> None:
    run = fast_runs[DROP_BATCH]
    assert not _guarantee_failures([run]), _explain(run)
    # its second bad batch is 9 steps before the end: too little of the run after it to tell
    # whether the run came back — "unjudged", never "recovered", and no failure exit
    assert (run.exit_code, run.status) == (0, "unjudged"), _explain(run)
    assert run.cause == "nonfinite-input"
    assert run.recoveries and all(r["action"] == "drop_batch" for r in run.recoveries), _explain(run)
    assert run.steps_lost == 0
    assert run.final_loss is not None and math.isfinite(run.final_loss), _explain(run)


def test_recover_rolls_back_a_too_high_learning_rate_and_finishes(
    fast_runs: dict[str, recovery.GuardedRun],
) -> None:
    run = fast_runs[ROLLBACK]
    assert not _guarantee_failures([run]), _explain(run)
    assert (run.exit_code, run.status) == (0, "recovered"), _explain(run)
    assert run.cause == "learning-rate-too-high"
    assert any(r["action"] == "rollback" and r.get("lr_factor") for r in run.recoveries), _explain(run)
    assert run.steps_lost >= 1
    assert run.final_loss is not None and math.isfinite(run.final_loss), _explain(run)


def test_recover_stops_an_unsafe_op_with_the_diagnosis(fast_runs: dict[str, recovery.GuardedRun]) -> None:
    run = fast_runs[UNSAFE]
    assert not _guarantee_failures([run]), _explain(run)
    assert (run.exit_code, run.status) == (3, "nonfinite"), _explain(run)
    assert run.stopped_with_diagnosis
    assert run.cause == "unsafe-op"
    assert run.recoveries == [], _explain(run)
    assert run.actions == "stopped: unsafe-op"


# --- slow: every failing scenario, both policies ------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["skip", "recover"])
def test_the_guarantee_holds_on_every_failing_scenario(policy: str) -> None:
    rows = recovery.run_all(_FAILING, policy=policy, fixed=False)
    bad = _guarantee_failures([r.guarded for r in rows])
    if bad:
        pytest.fail(f"{len(bad)}/{len(rows)} runs under --policy {policy}:\n" + "\n".join(bad),
                    pytrace=False)
