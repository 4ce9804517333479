"""The default mode's first suggested fix, applied by hand: does the script then train?

    python benchmarks/advice.py --framework holdout-cure      # benchmarks/scenarios/holdout_cure/*.py
    python benchmarks/advice.py --framework holdout-lr --jobs 2

For each failing scenario (one that reads ``NANGUARD_SCENARIO_FIXED`` for its sane version):

1. ``nanguard run --json TMP SCENARIO`` under the default policy (``raise``): the cause, and the
   first fix of its finding;
2. that fix applied as a user would, where it can be applied from the command line: a learning
   rate — ``run it again with `--lr X``` or an optimizer line ``lr=X`` in a script that takes the
   flag — is the run ``python SCENARIO --lr X`` (the script's own flag); a fix that changes code
   (standardise the data, a clamp) is left to a person and marked "by hand";
3. the sane version (``NANGUARD_SCENARIO_FIXED=1 python SCENARIO``) for the loss to compare with.

A fix *trains* when the run printed no non-finite loss and its final loss is within 2× of the
sane version's (or below it). A markdown table goes to stdout; the exit status is 0 (benchmarks
never gate).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import diagnose
import recovery

#: a learning rate in the first fix: the flag form, then an optimizer line's ``lr=``
_FLAG = re.compile(r"run it again with `(--[\w-]+) ([-+.\deE]+)`")
_LR = re.compile(r"\b(?:lr|learning_rate)=([-+.\deE]+)")
_NONFINITE = re.compile(r"\b(nan|inf)\b", re.IGNORECASE)


@dataclass
class Row:
    name: str
    cause: str | None = None
    first_fix: str | None = None
    applied: str | None = None  # the command-line change made, or None (by hand)
    fix_loss: float | None = None
    fix_nonfinite: bool = False
    sane_loss: float | None = None
    error: str | None = None

    @property
    def trains(self) -> bool | None:
        if self.applied is None:
            return None
        if self.fix_nonfinite or self.fix_loss is None or not math.isfinite(self.fix_loss):
            return False
        if self.sane_loss is None or not math.isfinite(self.sane_loss):
            return True
        return self.fix_loss <= recovery.WITHIN * self.sane_loss or self.fix_loss <= self.sane_loss

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "trains": self.trains}


def _flag_of(script: Path) -> str | None:
    text = script.read_text(encoding="utf-8")
    for flag in ("--lr", "--learning-rate", "--learning_rate"):
        if f'"{flag}"' in text or f"'{flag}'" in text:
            return flag
    return None


def apply_first_fix(fix: str, script: Path) -> list[str] | None:
    """The command-line arguments that apply ``fix`` to ``script``, or ``None`` (by hand)."""
    first = fix.splitlines()[0]
    m = _FLAG.search(first)
    if m:
        return [m.group(1), m.group(2)]
    m = _LR.search(first)
    flag = _flag_of(script)
    if m and flag and ("torch.optim." in first or "keras.optimizers." in first):
        return [flag, m.group(1).rstrip(",)")]
    return None


def run_one(scenario: diagnose.Scenario, timeout: float) -> Row:
    row = Row(scenario.name)
    with tempfile.TemporaryDirectory(prefix="nanguard-advice-") as tmp:
        json_path = os.path.join(tmp, "run.json")
        env = recovery.guarded_env()
        env.pop(recovery.VERIFY_ENV, None)
        _code, _out, _err, error, _s = recovery._run(
            diagnose.nanguard_command(scenario.path, json_path, "raise"), tmp, env, timeout)
        if error or not os.path.exists(json_path):
            row.error = error or "no run log"
            return row
        with open(json_path, encoding="utf-8") as fh:
            log = json.load(fh)
        events = log.get("events") or []
        if not events:
            row.error = "no finding"
            return row
        row.cause = events[0].get("cause")
        fixes = events[0].get("fixes") or []
        row.first_fix = fixes[0] if fixes else None
        args = apply_first_fix(row.first_fix, scenario.path) if row.first_fix else None
        if args is not None:
            row.applied = shlex.join(args)
            plain = recovery.fixed_env()
            plain.pop(recovery.FIXED_ENV, None)
            code, out, _err, _error, _s = recovery._run(
                [*recovery.fixed_command(scenario.path), *args], tmp, plain, timeout)
            row.fix_loss = recovery.final_loss(out)
            row.fix_nonfinite = bool(_NONFINITE.search(out)) or code not in (0, None)
        _code, out, _err, _error, _s = recovery._run(recovery.fixed_command(scenario.path), tmp,
                                                     recovery.fixed_env(), timeout)
        row.sane_loss = recovery.final_loss(out)
    return row


def _num(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"


def print_report(rows: list[Row], command: str) -> None:
    print(f"$ {command}\n")
    print("| scenario | cause | first fix | applied as | final loss (fix) | final loss (sane) | trains |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        fix = (r.first_fix or r.error or "—").splitlines()[0]
        fix = fix if len(fix) <= 90 else fix[:87] + "..."
        verdict = {True: "✓", False: "✗", None: "by hand"}[r.trains]
        loss = _num(r.fix_loss) + (" (non-finite on the way)" if r.fix_nonfinite else "")
        print(f"| `{r.name}` | {r.cause or '—'} | `{fix}` | {f'`{r.applied}`' if r.applied else '—'} | "
              f"{loss if r.applied else '—'} | {_num(r.sane_loss)} | {verdict} |")
    applied = [r for r in rows if r.applied]
    print(f"\nfirst fixes applied from the command line: {len(applied)}/{len(rows)}; trained without a NaN "
          f"within 2x of the sane run: {sum(bool(r.trains) for r in applied)}/{len(applied)}; by hand: "
          f"{sum(r.applied is None and r.error is None for r in rows)}; no finding: "
          f"{sum(r.error is not None for r in rows)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=("holdout-cure", "holdout-lr", "torch"), default="holdout-cure")
    parser.add_argument("--only", metavar="SUBSTRING", help="run the scenarios whose name contains it")
    parser.add_argument("--jobs", type=int, default=recovery.JOBS, help=f"runs at once (default {recovery.JOBS})")
    parser.add_argument("--timeout", type=float, default=recovery.TIMEOUT_S)
    parser.add_argument("--json", metavar="OUT", help="write the rows as JSON to OUT")
    args = parser.parse_args(argv)
    command = shlex.join(sys.orig_argv if argv is None else [sys.executable, str(Path(__file__)), *argv])
    sub = {"holdout-cure": "holdout_cure", "holdout-lr": "holdout_lr"}.get(args.framework)
    directory = diagnose.SCENARIOS_DIR / sub if sub else diagnose.SCENARIOS_DIR
    scenarios = [s for s in diagnose.discover(args.only, directory)
                 if not s.expect.healthy and recovery.has_fixed_mode(s)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(pool.map(lambda s: run_one(s, args.timeout), scenarios))
    print_report(rows, command)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"command": command, "rows": [r.to_dict() for r in rows]}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
