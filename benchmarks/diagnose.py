"""Run every labelled scenario under ``nanguard run`` and compare the result with its label.

    python benchmarks/diagnose.py                 # all scenarios, 2 at a time
    python benchmarks/diagnose.py --only unsafe_  # the ones whose name contains "unsafe_"
    python benchmarks/diagnose.py --json out.json --policy skip

Each scenario in ``benchmarks/scenarios/`` is a plain PyTorch training script that starts with

    # expect: {"cause": "unsafe-op", "phase": "forward", "op": "aten.log.default", "module": null}
    # about: one sentence

(or ``# expect: {"healthy": true}``). ``op`` and ``module`` may be lists of acceptable answers.
The script is run as ``python -m nanguard run --json <tmp> <scenario>``; the first event of the
run log is compared with the label. The table goes to stdout (a ``rich`` table on a terminal,
otherwise a markdown table that can be pasted into the README). Benchmarks never gate: the exit
status is always 0.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCENARIOS_DIR = HERE / "scenarios"
REPO = HERE.parent
TIMEOUT_S = 600  # a hang guard: a scenario takes seconds, more on a busy machine
JOBS = 2
EXIT_NONFINITE = 3
CHECKS = ("detected", "cause", "op", "module", "phase")


# ----------------------------------------------------------------------------------------------
# scenarios and their labels


@dataclass(frozen=True)
class Expectation:
    """The label of a scenario: what a correct tool reports for it."""

    healthy: bool
    cause: str | None = None
    phase: str | None = None
    ops: tuple[str, ...] = ()
    modules: tuple[str | None, ...] = ()
    about: str = ""

    @classmethod
    def from_header(cls, expect: dict[str, Any], about: str = "") -> Expectation:
        if expect.get("healthy"):
            return cls(healthy=True, about=about)
        missing = [k for k in ("cause", "phase", "op", "module") if k not in expect]
        if missing:
            raise ValueError(f"label lacks {', '.join(missing)}")
        op, module = expect["op"], expect["module"]
        return cls(
            healthy=False,
            cause=expect["cause"],
            phase=expect["phase"],
            ops=tuple(op) if isinstance(op, list) else (op,),
            modules=tuple(module) if isinstance(module, list) else (module,),
            about=about,
        )

    def describe(self) -> str:
        return "healthy" if self.healthy else str(self.cause)


@dataclass(frozen=True)
class Scenario:
    name: str
    path: Path
    expect: Expectation


def parse_header(path: Path) -> Expectation:
    """Read the ``# expect:`` and ``# about:`` lines at the top of a scenario."""
    expect: dict[str, Any] | None = None
    about = ""
    with open(path, encoding="utf-8") as fh:
        for _ in range(5):
            line = fh.readline()
            if line.startswith("# expect:"):
                expect = json.loads(line.split(":", 1)[1])
            elif line.startswith("# about:"):
                about = line.split(":", 1)[1].strip()
    if expect is None:
        raise ValueError(f"{path.name}: no '# expect:' header in its first lines")
    try:
        return Expectation.from_header(expect, about)
    except ValueError as exc:
        raise ValueError(f"{path.name}: {exc}") from None


def discover(only: str | None = None, directory: Path = SCENARIOS_DIR) -> list[Scenario]:
    """All scenarios, sorted by name; ``only`` keeps those whose name contains it."""
    out = []
    for path in sorted(directory.glob("*.py")):
        if path.name.startswith("_"):
            continue
        if only and only not in path.stem:
            continue
        out.append(Scenario(path.stem, path, parse_header(path)))
    return out


# ----------------------------------------------------------------------------------------------
# running one scenario


@dataclass
class Result:
    name: str
    expect: Expectation
    exit_code: int | None
    status: str | None
    event: dict[str, Any] | None
    n_events: int
    seconds: float
    error: str | None = None
    checks: dict[str, bool | None] = field(default_factory=dict)
    stderr_tail: str = ""
    warnings: list[dict[str, Any]] = field(default_factory=list)  # the run log's early warnings

    @property
    def got(self) -> str:
        if self.error and self.event is None:
            return f"error: {self.error}"
        if self.event is None:
            return "healthy" if self.n_events == 0 else "?"
        return str(self.event.get("cause"))

    @property
    def ok(self) -> bool:
        """True when every check that applies passed."""
        return all(v is not False for v in self.checks.values())

    def mismatches(self) -> list[str]:
        """Human-readable list of what differs from the label (empty when it matches)."""
        out = []
        e, ev = self.expect, self.event or {}
        if self.error:
            out.append(f"error: {self.error}")
        if e.healthy:
            if self.checks.get("detected") is False:
                out.append(
                    f"false positive: {ev.get('cause')} at {ev.get('op')} ({ev.get('phase')}, "
                    f"module {ev.get('module')!r}, step {ev.get('step')})"
                )
            if self.checks.get("exit") is False:
                out.append(f"exit status {self.exit_code}, expected 0")
            return out
        if self.checks.get("detected") is False:
            out.append(f"not detected (exit {self.exit_code}, status {self.status})")
            return out
        if self.checks.get("cause") is False:
            out.append(f"cause {ev.get('cause')!r}, expected {e.cause!r}")
        if self.checks.get("op") is False:
            out.append(f"op {ev.get('op')!r}, expected {_alts(e.ops)}")
        if self.checks.get("module") is False:
            out.append(f"module {ev.get('module')!r}, expected {_alts(e.modules)}")
        if self.checks.get("phase") is False:
            out.append(f"phase {ev.get('phase')!r}, expected {e.phase!r}")
        if self.checks.get("exit") is False:
            out.append(f"exit status {self.exit_code}, expected {EXIT_NONFINITE}")
        return out

    def to_dict(self) -> dict[str, Any]:
        e = self.expect
        return {
            "name": self.name,
            "expect": {
                "healthy": e.healthy,
                "cause": e.cause,
                "phase": e.phase,
                "op": list(e.ops),
                "module": list(e.modules),
            },
            "exit_code": self.exit_code,
            "status": self.status,
            "n_events": self.n_events,
            "event": _short_event(self.event),
            "seconds": round(self.seconds, 2),
            "error": self.error,
            "checks": dict(self.checks),
            "ok": self.ok,
            "mismatches": self.mismatches(),
        }


def _alts(values: tuple[Any, ...]) -> str:
    return " or ".join(repr(v) for v in values)


def _short_event(ev: dict[str, Any] | None) -> dict[str, Any] | None:
    if ev is None:
        return None
    keys = (
        "step", "phase", "op", "grad_fn", "module", "module_type", "source", "dtype", "nan",
        "posinf", "neginf", "reached", "detected_by", "cause", "confidence", "summary", "evidence",
    )
    return {k: ev.get(k) for k in keys}


def check(expect: Expectation, exit_code: int | None, log: dict[str, Any] | None,
          policy: str = "raise") -> dict[str, bool | None]:
    """Compare a run log with a label; ``None`` marks a check that does not apply."""
    events = (log or {}).get("events") or []
    ev = events[0] if events else None
    if expect.healthy:
        return {
            "detected": None if log is None else ev is None,  # for a healthy control: True when nothing was reported
            "cause": None, "op": None, "module": None, "phase": None,
            "exit": exit_code == 0,
        }
    if ev is None:
        return {"detected": False, "cause": None, "op": None, "module": None, "phase": None,
                "exit": None}
    return {
        "detected": True,
        "cause": ev.get("cause") == expect.cause,
        "op": ev.get("op") in expect.ops,
        "module": ev.get("module") in expect.modules,
        "phase": ev.get("phase") == expect.phase,
        "exit": (exit_code == EXIT_NONFINITE) if policy == "raise" else None,
    }


RUN_FLAGS: list[str] = []  # further `nanguard run` flags (``--trace``)


def nanguard_command(script: Path, json_path: str, policy: str = "raise") -> list[str]:
    return [os.path.abspath(sys.executable), "-m", "nanguard", "run", *RUN_FLAGS, "--policy", policy,
            "--json", json_path, str(script)]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(REPO / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONHASHSEED", "0")
    env.pop("NANGUARD_POLICY", None)
    return env


def run_scenario(scenario: Scenario, policy: str = "raise", timeout: float = TIMEOUT_S) -> Result:
    """Run one scenario under ``nanguard run`` and check its first event against the label."""
    with tempfile.TemporaryDirectory(prefix="nanguard-bench-") as tmp:
        json_path = os.path.join(tmp, "run.json")
        cmd = nanguard_command(scenario.path, json_path, policy)
        t0 = time.perf_counter()
        error = None
        exit_code: int | None = None
        stderr = ""
        try:
            proc = subprocess.run(cmd, cwd=tmp, env=_env(), capture_output=True, text=True,
                                  timeout=timeout)
            exit_code, stderr = proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as exc:
            error = f"timeout after {timeout:g} s"
            stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (
                exc.stderr or "")
        seconds = time.perf_counter() - t0
        log: dict[str, Any] | None = None
        if os.path.exists(json_path):
            try:
                with open(json_path, encoding="utf-8") as fh:
                    log = json.load(fh)
            except (OSError, json.JSONDecodeError) as exc:
                error = error or f"unreadable run log: {exc}"
        elif error is None:
            last = stderr.strip().splitlines()[-1:] or [""]
            error = f"no run log (exit {exit_code}) {last[0][:200]}".strip()
    events = (log or {}).get("events") or []
    status = (log or {}).get("status")
    if error is None and status == "error":
        error = f"the script raised: {(log or {}).get('error')}"
    return Result(
        name=scenario.name,
        expect=scenario.expect,
        exit_code=exit_code,
        status=status,
        event=events[0] if events else None,
        n_events=len(events),
        seconds=seconds,
        error=error,
        checks=check(scenario.expect, exit_code, log, policy),
        stderr_tail=stderr[-2000:],
        warnings=list((log or {}).get("warnings") or []),
    )


def run_all(scenarios: list[Scenario], policy: str = "raise", jobs: int = JOBS,
            timeout: float = TIMEOUT_S) -> list[Result]:
    """Run the scenarios ``jobs`` at a time; results come back in the scenarios' order."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_scenario, s, policy, timeout) for s in scenarios]
        return [f.result() for f in futures]


# ----------------------------------------------------------------------------------------------
# reporting


def totals(results: list[Result]) -> dict[str, Any]:
    bad = [r for r in results if not r.expect.healthy]
    healthy = [r for r in results if r.expect.healthy]

    def count(key: str) -> int:
        return sum(1 for r in bad if r.checks.get(key) is True)

    return {
        "scenarios": len(results),
        "failing": len(bad),
        "healthy": len(healthy),
        "detected": count("detected"),
        "cause": count("cause"),
        "op": count("op"),
        "module": count("module"),
        "phase": count("phase"),
        "all_right": sum(1 for r in bad if r.ok),
        "false_positives": sum(1 for r in healthy if r.checks.get("detected") is False),
        "healthy_bad_exit": sum(1 for r in healthy if r.checks.get("exit") is False),
        "errors": sum(1 for r in results if r.error),
        "seconds": round(sum(r.seconds for r in results), 1),
    }


def totals_line(t: dict[str, Any]) -> str:
    n = t["failing"]
    return (
        f"detected {t['detected']}/{n}, cause right {t['cause']}/{n}, op right {t['op']}/{n}, "
        f"module right {t['module']}/{n}, phase right {t['phase']}/{n}, "
        f"all right {t['all_right']}/{n}; "
        f"false positives on healthy controls {t['false_positives']}/{t['healthy']}"
        + (f" (bad exit status on {t['healthy_bad_exit']})" if t["healthy_bad_exit"] else "")
        + f"; errors {t['errors']}; {t['seconds']} s of runs"
    )


def _mark(v: bool | None) -> str:
    return "—" if v is None else ("✓" if v else "✗")


HEADERS = ("scenario", "expected", "got", "detected", "cause", "op", "module", "phase", "s")


def rows(results: list[Result]) -> list[tuple[str, ...]]:
    out = []
    for r in results:
        c = r.checks
        det = c.get("detected")
        if r.expect.healthy:
            det_s = "—" if det is None else ("✓ none" if det else "✗ FP")
        else:
            det_s = _mark(det)
        out.append((
            r.name, r.expect.describe(), r.got, det_s, _mark(c.get("cause")), _mark(c.get("op")),
            _mark(c.get("module")), _mark(c.get("phase")), f"{r.seconds:.1f}",
        ))
    return out


def markdown_table(results: list[Result]) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join("---" for _ in HEADERS) + "|"]
    for row in rows(results):
        lines.append("| " + " | ".join(f"`{row[0]}`" if i == 0 else row[i]
                                       for i in range(len(row))) + " |")
    return "\n".join(lines)


def print_report(results: list[Result], command: str, use_rich: bool | None = None,
                 policy: str = "raise") -> None:
    t = totals(results)
    if use_rich is None:
        use_rich = sys.stdout.isatty()
    if use_rich:
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            use_rich = False
    if use_rich:
        console = Console()
        console.print(f"$ {command}", markup=False, highlight=False)
        console.print(f"  each scenario: {shlex.join(nanguard_command(Path('SCENARIO'), 'TMP.json', policy))}",
                      markup=False, highlight=False)
        table = Table(show_lines=False)
        for h in HEADERS:
            table.add_column(h, justify="right" if h == "s" else "left",
                             overflow="fold", no_wrap=h not in ("scenario", "expected", "got"))
        for row in rows(results):
            table.add_row(*row, style=None)
        console.print(table)
        console.print(totals_line(t), markup=False, highlight=False)
    else:
        print(f"$ {command}")
        print(f"  each scenario: {shlex.join(nanguard_command(Path('SCENARIO'), 'TMP.json', policy))}\n")
        print(markdown_table(results))
        print()
        print(totals_line(t))
    wrong = [r for r in results if not r.ok]
    if wrong:
        print("\nmismatches:")
        for r in wrong:
            print(f"  {r.name}: " + "; ".join(r.mismatches()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", metavar="SUBSTRING", help="run the scenarios whose name contains it")
    parser.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    parser.add_argument("--policy", default="raise",
                        help="passed through to `nanguard run --policy` (default: raise)")
    parser.add_argument("--jobs", type=int, default=JOBS, help=f"scenarios run at once (default {JOBS})")
    parser.add_argument("--framework", choices=("torch", "keras", "holdout", "keras-holdout", "holdout-lr",
                                                "holdout-early", "holdout-late", "holdout-cure"),
                        default="torch",
                        help="torch: benchmarks/scenarios/*.py (default); keras: benchmarks/scenarios/keras/*.py; "
                        "holdout: benchmarks/scenarios/holdout/*.py (PyTorch scripts written after the suite); "
                        "keras-holdout: benchmarks/scenarios/keras/holdout/*.py (the same, for Keras); "
                        "holdout-lr, holdout-early, holdout-late, holdout-cure: the learning-rate, the two "
                        "early-warning and the cure held-out rounds")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S,
                        help=f"seconds per scenario (default {TIMEOUT_S})")
    parser.add_argument("--trace", action="store_true",
                        help="run each scenario under `nanguard run --trace` (every op checked)")
    args = parser.parse_args(argv)
    RUN_FLAGS[:] = ["--trace"] if args.trace else []
    command = shlex.join(sys.orig_argv if argv is None
                         else [sys.executable, str(Path(__file__)), *argv])
    sub = {"keras": "keras", "holdout": "holdout", "keras-holdout": "keras/holdout",
           "holdout-lr": "holdout_lr", "holdout-early": "holdout_early",
           "holdout-late": "holdout_late", "holdout-cure": "holdout_cure"}.get(args.framework)
    scenarios = discover(args.only, SCENARIOS_DIR / sub if sub else SCENARIOS_DIR)
    if not scenarios:
        print(f"$ {command}\nno scenario matches {args.only!r}")
        return 0
    results = run_all(scenarios, policy=args.policy, jobs=args.jobs, timeout=args.timeout)
    print_report(results, command, policy=args.policy)
    if args.json:
        doc = {
            "command": command,
            "policy": args.policy,
            "totals": totals(results),
            "results": [r.to_dict() for r in results],
        }
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
