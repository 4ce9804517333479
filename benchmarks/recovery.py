"""Run the labelled scenarios under ``nanguard run --policy recover`` and compare each failing one
with its hand-fixed version.

    python benchmarks/recovery.py                      # all torch scenarios, 2 at a time
    python benchmarks/recovery.py --policy skip --only lr_
    python benchmarks/recovery.py --framework keras    # benchmarks/scenarios/keras/*.py
    python benchmarks/recovery.py --framework holdout --no-fixed   # the held-out scripts
    python benchmarks/recovery.py --json out.json

For each failing scenario, two runs:

* guarded: ``NANGUARD_VERIFY=1 python -m nanguard run --policy recover --json TMP SCENARIO`` —
  the cause nanguard diagnosed, what the policy did (drop the batch, roll back with a
  learning-rate back-off / clipping / a larger eps, or stop with the diagnosis where no blind fix
  exists: ``unsafe-op``, ``bad-initialization``, ``nonfinite-parameters``,
  ``low-precision-overflow``), the steps lost to rollbacks (``recoveries[].steps_lost``), the
  final loss, and the guarantee check of ``NANGUARD_VERIFY`` (the run log's ``notes``: weights and
  optimizer state finite after every step);
* hand-fixed: ``NANGUARD_SCENARIO_FIXED=1 python SCENARIO`` — the fix a person makes after reading
  the diagnosis (only for scripts that read that variable).

The final loss is the number after ``loss`` on the last line of the script's stdout that has one
(every scenario prints ``final loss X`` last). Healthy controls run guarded only and must finish
with no event. A markdown table goes to stdout. Benchmarks never gate: the exit status is 0.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import diagnose

TIMEOUT_S = 600  # a hang guard: a run takes seconds, more on a busy machine
JOBS = 2
POLICIES = ("recover", "skip")
EXIT_OK, EXIT_NONFINITE, EXIT_NOT_RECOVERED = 0, 3, 4
#: a recovered run "comes back" when its final loss is within this factor of the hand-fixed run's
WITHIN = 2.0
FIXED_ENV = "NANGUARD_SCENARIO_FIXED"
VERIFY_ENV = "NANGUARD_VERIFY"
#: causes for which ``recover`` has no blind fix: the run must stop with the diagnosis
UNFIXABLE = ("unsafe-op", "bad-initialization", "nonfinite-parameters", "low-precision-overflow", "unscaled-data")
VERIFY_OK = "verify: weights and optimizer state stayed finite"
VERIFY_BAD = "verify: non-finite"
_LOSS = re.compile(
    r"\bloss\s+([-+]?(?:nan|inf(?:inity)?|\d+(?:\.\d*)?(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?))(?![\w.])",
    re.IGNORECASE,
)


def final_loss(stdout: str) -> float | None:
    """The number after ``loss`` on the last line of ``stdout`` that has one (NaN/Inf included)."""
    for line in reversed(stdout.splitlines()):
        m = _LOSS.search(line)
        if m:
            return float(m.group(1))
    return None


def has_fixed_mode(scenario: diagnose.Scenario) -> bool:
    return FIXED_ENV in scenario.path.read_text(encoding="utf-8")


# ----------------------------------------------------------------------------------------------
# the two runs


@dataclass
class GuardedRun:
    """One scenario under ``nanguard run --policy POLICY`` with ``NANGUARD_VERIFY=1``."""

    name: str
    policy: str
    exit_code: int | None
    status: str | None
    cause: str | None  # the first event's diagnosed cause
    steps: int | None
    recoveries: list[dict[str, Any]]
    notes: list[str]
    n_events: int
    final_loss: float | None
    seconds: float
    error: str | None = None
    stderr_tail: str = ""
    outcome: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        """The script ran to its end (whether or not its loss came back)."""
        return (self.exit_code, self.status) in ((EXIT_OK, "ok"), (EXIT_OK, "recovered"), (EXIT_OK, "unjudged"),
                                                 (EXIT_NOT_RECOVERED, "not-recovered"))

    @property
    def stopped_with_diagnosis(self) -> bool:
        return self.exit_code == EXIT_NONFINITE and self.status == "nonfinite" and self.n_events > 0

    @property
    def verify(self) -> bool | None:
        """True: the guarantee held after every step; False: a step left a non-finite weight or
        optimizer state; None: no verify note (the run log is missing or the check did not run)."""
        if any(n.startswith(VERIFY_BAD) for n in self.notes):
            return False
        if any(n.startswith(VERIFY_OK) for n in self.notes):
            return True
        return None

    @property
    def violations(self) -> list[str]:
        return [n for n in self.notes if n.startswith(VERIFY_BAD)]

    @property
    def steps_lost(self) -> int:
        return sum(int(r.get("steps_lost") or 0) for r in self.recoveries)

    @property
    def actions(self) -> str:
        """What the policy did, in words: its recoveries' descriptions, or how it stopped."""
        did = _actions(self.recoveries)
        gave_up = bool(self.recoveries) and self.recoveries[-1].get("action") == "give_up"
        if self.exit_code == EXIT_NONFINITE and not gave_up:
            stop = f"stopped: {self.cause or '?'}"
            return stop if did == "—" else f"{did}; {stop}"
        return did

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "exit_code": self.exit_code,
            "status": self.status,
            "finished": self.finished,
            "cause": self.cause,
            "steps": self.steps,
            "n_events": self.n_events,
            "actions": self.actions,
            "recoveries": self.recoveries,
            "steps_lost": self.steps_lost,
            "final_loss": _json_float(self.final_loss),
            "outcome": self.outcome,
            "verify": self.verify,
            "notes": self.notes,
            "seconds": round(self.seconds, 2),
            "error": self.error,
        }


@dataclass
class FixedRun:
    """The hand-fixed version of a scenario: ``NANGUARD_SCENARIO_FIXED=1 python SCENARIO``."""

    name: str
    exit_code: int | None
    final_loss: float | None
    seconds: float
    error: str | None = None
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return (self.exit_code == 0 and self.final_loss is not None
                and math.isfinite(self.final_loss))

    def to_dict(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code, "final_loss": _json_float(self.final_loss),
                "seconds": round(self.seconds, 2), "error": self.error}


def _actions(recoveries: list[dict[str, Any]]) -> str:
    """The recoveries' descriptions in order, repeats folded: ``drop batch (×3)``."""
    if not recoveries:
        return "—"
    out: list[str] = []
    for r in recoveries:
        d = r.get("description") or r.get("action", "?")
        if out and out[-1].split(" (×")[0] == d:
            n = int(out[-1].split("(×")[1].rstrip(")")) + 1 if "(×" in out[-1] else 2
            out[-1] = f"{d} (×{n})"
        else:
            out.append(d)
    return "; ".join(out)


def _json_float(v: float | None) -> float | str | None:
    return v if v is None or math.isfinite(v) else str(v)


def guarded_env() -> dict[str, str]:
    env = diagnose._env()
    env[VERIFY_ENV] = "1"
    env.pop(FIXED_ENV, None)
    return env


def fixed_env() -> dict[str, str]:
    env = diagnose._env()
    env[FIXED_ENV] = "1"
    env.pop(VERIFY_ENV, None)
    return env


def fixed_command(script: Path) -> list[str]:
    return [os.path.abspath(sys.executable), str(script)]


def _run(cmd: list[str], cwd: str, env: dict[str, str], timeout: float
         ) -> tuple[int | None, str, str, str | None, float]:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        return proc.returncode, proc.stdout, proc.stderr, None, time.perf_counter() - t0
    except subprocess.TimeoutExpired as exc:
        def text(b: Any) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        return (None, text(exc.stdout), text(exc.stderr), f"timeout after {timeout:g} s",
                time.perf_counter() - t0)


def run_guarded(scenario: diagnose.Scenario, policy: str = "recover",
                timeout: float = TIMEOUT_S) -> GuardedRun:
    """``scenario`` under ``nanguard run --policy POLICY --json`` with ``NANGUARD_VERIFY=1``."""
    with tempfile.TemporaryDirectory(prefix="nanguard-recovery-") as tmp:
        json_path = os.path.join(tmp, "run.json")
        code, out, err, error, seconds = _run(
            diagnose.nanguard_command(scenario.path, json_path, policy), tmp, guarded_env(), timeout)
        log: dict[str, Any] = {}
        if os.path.exists(json_path):
            try:
                with open(json_path, encoding="utf-8") as fh:
                    log = json.load(fh)
            except (OSError, json.JSONDecodeError) as exc:
                error = error or f"unreadable run log: {exc}"
        elif error is None:
            last = err.strip().splitlines()[-1:] or [""]
            error = f"no run log (exit {code}) {last[0][:200]}".strip()
    events = log.get("events") or []
    if error is None and log.get("status") == "error":
        error = f"the script raised: {log.get('error')}"
    return GuardedRun(
        name=scenario.name,
        policy=policy,
        exit_code=code,
        status=log.get("status"),
        cause=events[0].get("cause") if events else None,
        steps=log.get("steps"),
        recoveries=list(log.get("recoveries") or []),
        notes=[str(n) for n in log.get("notes") or []],
        n_events=len(events),
        final_loss=final_loss(out),
        seconds=seconds,
        error=error,
        stderr_tail=err[-2000:],
        outcome=log.get("outcome"),
    )


def run_fixed(scenario: diagnose.Scenario, timeout: float = TIMEOUT_S) -> FixedRun | None:
    """The hand-fixed version (plain ``python``, no nanguard); None when the script has none."""
    if not has_fixed_mode(scenario):
        return None
    with tempfile.TemporaryDirectory(prefix="nanguard-fixed-") as tmp:
        code, out, err, error, seconds = _run(fixed_command(scenario.path), tmp, fixed_env(), timeout)
    loss = final_loss(out)
    if error is None and code != 0:
        last = err.strip().splitlines()[-1:] or [""]
        error = f"exit {code}: {last[0][:200]}"
    elif error is None and loss is None:
        error = "no 'loss <number>' line in its output"
    return FixedRun(scenario.name, code, loss, seconds, error, err[-2000:])


@dataclass
class Row:
    scenario: diagnose.Scenario
    guarded: GuardedRun
    fixed: FixedRun | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return self.scenario.expect.healthy

    @property
    def ratio(self) -> float | None:
        """Final loss under the policy ÷ the hand-fixed run's (finished runs, positive losses)."""
        g, f = self.guarded, self.fixed
        if not g.finished or self.healthy or f is None or not f.ok or g.final_loss is None:
            return None
        if f.final_loss is None or f.final_loss <= 0 or not math.isfinite(g.final_loss) or g.final_loss < 0:
            return None
        return g.final_loss / f.final_loss

    @property
    def claim_contradicted(self) -> bool:
        """Said ``recovered`` while its final loss is more than ``WITHIN``× the hand-fixed one."""
        return self.guarded.status == "recovered" and self.ratio is not None and self.ratio > WITHIN

    @property
    def expected_stop(self) -> bool:
        """The label's cause has no blind fix: ``recover`` must stop with the diagnosis."""
        return self.scenario.expect.cause in UNFIXABLE

    def problems(self) -> list[str]:
        """What is wrong with this row (empty when nothing is)."""
        g, out = self.guarded, []
        if g.error:
            out.append(f"error: {g.error}")
        if g.exit_code not in (EXIT_OK, EXIT_NONFINITE, EXIT_NOT_RECOVERED):
            out.append(f"exit status {g.exit_code} (expected 0, 3 or 4)")
        if self.claim_contradicted:
            out.append(f"said recovered, but its final loss is {self.ratio:.3g}× the hand-fixed run's")
        if g.verify is False:
            out.append("guarantee violated: " + " | ".join(g.violations[:3])
                       + (f" | … ({len(g.violations)} notes)" if len(g.violations) > 3 else ""))
        elif g.verify is None and not g.error:
            out.append("no verify note in the run log")
        if self.healthy:
            if not (g.finished and g.status == "ok" and g.n_events == 0):
                out.append(f"healthy control: exit {g.exit_code}, status {g.status}, {g.n_events} event(s)")
            return out
        if g.cause and g.cause != self.scenario.expect.cause:
            out.append(f"diagnosed {g.cause}, label {self.scenario.expect.cause}")
        if g.policy == "recover":
            if self.expected_stop and g.finished:
                out.append(f"{self.scenario.expect.cause} has no blind fix, yet the run finished")
            if self.expected_stop and not g.finished and not g.stopped_with_diagnosis:
                out.append("did not stop with the diagnosis")
            if not self.expected_stop and not g.finished:
                out.append(f"recoverable cause did not finish: {g.actions}")
        if g.finished and (g.final_loss is None or not math.isfinite(g.final_loss)):
            out.append(f"finished with final loss {g.final_loss}")
        if self.fixed is not None and not self.fixed.ok:
            out.append(f"hand-fixed run: {self.fixed.error or f'final loss {self.fixed.final_loss}'}")
        return out

    def to_dict(self) -> dict[str, Any]:
        e = self.scenario.expect
        return {
            "name": self.scenario.name,
            "expected": e.describe(),
            "expected_stop": None if self.healthy else self.expected_stop,
            "guarded": self.guarded.to_dict(),
            "fixed": self.fixed.to_dict() if self.fixed is not None else None,
            "problems": self.problems(),
        }


def run_all(scenarios: list[diagnose.Scenario], policy: str = "recover", jobs: int = JOBS,
            timeout: float = TIMEOUT_S, fixed: bool = True) -> list[Row]:
    """Guarded runs (and hand-fixed runs of the failing scenarios) ``jobs`` at a time; rows come
    back in the scenarios' order."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        g_futs = [pool.submit(run_guarded, s, policy, timeout) for s in scenarios]
        f_futs = [pool.submit(run_fixed, s, timeout) if fixed and not s.expect.healthy else None
                  for s in scenarios]
        return [Row(s, g.result(), f.result() if f is not None else None)
                for s, g, f in zip(scenarios, g_futs, f_futs)]


# ----------------------------------------------------------------------------------------------
# reporting


def totals(rows: list[Row]) -> dict[str, Any]:
    bad = [r for r in rows if not r.healthy]
    healthy = [r for r in rows if r.healthy]
    stop = [r for r in bad if r.expected_stop]
    fixable = [r for r in bad if not r.expected_stop]
    fixed = [r for r in bad if r.fixed is not None]
    return {
        "policy": rows[0].guarded.policy if rows else None,
        "failing": len(bad),
        "finished": sum(1 for r in bad if r.guarded.finished),
        "expected_stop": len(stop),
        "stopped_as_expected": sum(1 for r in stop if r.guarded.stopped_with_diagnosis),
        "recoverable": len(fixable),
        "recoverable_finished": sum(1 for r in fixable if r.guarded.finished),
        "recovered": sum(1 for r in bad if r.guarded.status == "recovered"),
        "recovered_within": sum(1 for r in bad if r.guarded.status == "recovered" and r.ratio is not None
                                and r.ratio <= WITHIN),
        "recovered_compared": sum(1 for r in bad if r.guarded.status == "recovered" and r.ratio is not None),
        "not_recovered": sum(1 for r in bad if r.guarded.status == "not-recovered"),
        "unjudged": sum(1 for r in bad if r.guarded.status == "unjudged"),
        "contradicted": sum(1 for r in bad if r.claim_contradicted),
        "guarantee_held": sum(1 for r in bad if r.guarded.verify is True),
        "guarantee_violated": sum(1 for r in bad if r.guarded.verify is False),
        "steps_lost": sum(r.guarded.steps_lost for r in bad),
        "crashed": sum(1 for r in rows if r.guarded.exit_code not in (EXIT_OK, EXIT_NONFINITE, EXIT_NOT_RECOVERED)),
        "fixed_runs": len(fixed),
        "fixed_ok": sum(1 for r in fixed if r.fixed is not None and r.fixed.ok),
        "healthy": len(healthy),
        "healthy_clean": sum(1 for r in healthy if not r.problems()),
        "seconds": round(sum(r.guarded.seconds + (r.fixed.seconds if r.fixed else 0.0) for r in rows), 1),
    }


def totals_lines(t: dict[str, Any]) -> list[str]:
    n, p = t["failing"], t["policy"]
    lines = [
        f"finished under '{p}': {t['finished']}/{n} (recoverable causes {t['recoverable_finished']}/"
        f"{t['recoverable']}); expected to stop with the diagnosis (no blind fix: "
        f"{', '.join(UNFIXABLE)}): {t['expected_stop']}, stopped so: {t['stopped_as_expected']}/"
        f"{t['expected_stop']}",
        f"guarantee held on {t['guarantee_held']}/{n} runs (violated on {t['guarantee_violated']}); "
        f"total steps lost to rollbacks: {t['steps_lost']}; exit status other than 0/3/4: {t['crashed']}",
        f"said recovered: {t['recovered']} (final loss within {WITHIN:g}× the hand-fixed run's: "
        f"{t['recovered_within']}/{t['recovered_compared']} compared); said not recovered (exit 4): "
        f"{t['not_recovered']}; said unjudged (too little of the run to tell): {t.get('unjudged', 0)}; "
        f"said recovered but more than {WITHIN:g}× off: {t['contradicted']}",
    ]
    if t["fixed_runs"]:
        lines.append(f"hand-fixed runs that finished with a finite loss: {t['fixed_ok']}/{t['fixed_runs']}")
    if t["healthy"]:
        lines.append(f"healthy controls that finished with no event: {t['healthy_clean']}/{t['healthy']}")
    lines.append(f"{t['seconds']} s of runs")
    return lines


def _loss(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"


def _mark(v: bool | None) -> str:
    return "?" if v is None else ("✓" if v else "✗")


def headers(policy: str) -> tuple[str, ...]:
    return ("scenario", "cause", "exit / status", "what the policy did", "steps lost",
            f"final loss ({policy})", "final loss (hand-fixed)", "ratio", "verify", "s")


def table_rows(rows: list[Row]) -> list[tuple[str, ...]]:
    out = []
    for r in rows:
        g, f = r.guarded, r.fixed
        cause = "healthy" if r.healthy else str(r.scenario.expect.cause)
        if g.cause and g.cause != cause:
            cause = f"{g.cause} (label {cause})"
        end = f"{g.exit_code} / {g.status}" if g.error is None or g.status else f"error: {g.error}"
        secs = f"{g.seconds:.1f}" + (f" + {f.seconds:.1f}" if f is not None else "")
        out.append((
            f"`{r.scenario.name}`", cause, end, g.actions,
            str(g.steps_lost) if g.recoveries or not r.healthy else "—",
            _loss(g.final_loss) if g.finished and not r.healthy else "—",
            (_loss(f.final_loss) if f.exit_code == 0 else f"exit {f.exit_code}") if f is not None else "—",
            f"{r.ratio:.3g}×" if r.ratio is not None else "—",
            _mark(g.verify), secs,
        ))
    return out


def markdown_table(rows: list[Row], policy: str) -> str:
    hs = headers(policy)
    lines = ["| " + " | ".join(hs) + " |", "|" + "|".join("---" for _ in hs) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(rows)]
    return "\n".join(lines)


def print_report(rows: list[Row], command: str, policy: str) -> None:
    print(f"$ {command}")
    print(f"  guarded:    {VERIFY_ENV}=1 "
          f"{shlex.join(diagnose.nanguard_command(Path('SCENARIO'), 'TMP.json', policy))}")
    print(f"  hand-fixed: {FIXED_ENV}=1 {shlex.join(fixed_command(Path('SCENARIO')))}")
    print("  (final loss: the last `loss <number>` the script printed, for failing scenarios whose run finished; "
          "s: wall time of the guarded + hand-fixed runs)\n")
    print(markdown_table(rows, policy))
    print()
    for line in totals_lines(totals(rows)):
        print(line)
    wrong = [(r, r.problems()) for r in rows]
    wrong = [(r, p) for r, p in wrong if p]
    if wrong:
        print("\nproblems:")
        for r, p in wrong:
            print(f"  {r.scenario.name}: " + "; ".join(p))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", metavar="SUBSTRING", help="run the scenarios whose name contains it")
    parser.add_argument("--policy", default="recover", choices=POLICIES,
                        help="passed to `nanguard run --policy` (default: recover)")
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    parser.add_argument("--jobs", type=int, default=JOBS, help=f"runs at once (default {JOBS})")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S,
                        help=f"seconds per run (default {TIMEOUT_S:g})")
    parser.add_argument("--framework", choices=("torch", "keras", "holdout", "holdout-lr", "holdout-cure"),
                        default="torch",
                        help="torch: benchmarks/scenarios/*.py (default); keras: benchmarks/scenarios/keras/*.py; "
                             "holdout: benchmarks/scenarios/holdout/*.py (no hand-fixed versions: use --no-fixed); "
                             "holdout-lr: benchmarks/scenarios/holdout_lr/*.py (learning rates 1e2-1e8x too high); "
                             "holdout-cure: benchmarks/scenarios/holdout_cure/*.py (the cure round)")
    parser.add_argument("--no-healthy", action="store_true", help="leave out the healthy controls")
    parser.add_argument("--no-fixed", action="store_true", help="skip the hand-fixed runs")
    args = parser.parse_args(argv)
    command = shlex.join(sys.orig_argv if argv is None
                         else [sys.executable, str(Path(__file__)), *argv])
    sub = {"keras": "keras", "holdout": "holdout", "holdout-lr": "holdout_lr",
           "holdout-cure": "holdout_cure"}.get(args.framework)
    directory = diagnose.SCENARIOS_DIR / sub if sub else diagnose.SCENARIOS_DIR
    scenarios = [s for s in diagnose.discover(args.only, directory)
                 if not (args.no_healthy and s.expect.healthy)]
    if not scenarios:
        print(f"$ {command}\nno scenario matches {args.only!r}")
        return 0
    rows = run_all(scenarios, policy=args.policy, jobs=args.jobs, timeout=args.timeout,
                   fixed=not args.no_fixed)
    print_report(rows, command, args.policy)
    if args.json:
        doc = {"command": command, "policy": args.policy, "totals": totals(rows),
               "results": [r.to_dict() for r in rows]}
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
