"""Early warnings against the scenario suites: does a warning come before the first NaN?

    python benchmarks/early.py                 # the torch suite and the held-out rounds, 2 at a time
    python benchmarks/early.py --jobs 1 --json out.json
    python benchmarks/early.py --keras         # the Keras suite and its held-out round instead
    python benchmarks/early.py --only m03 s05  # a few scenarios, by the start of their name

Every scenario of ``benchmarks/scenarios`` (the suite), ``scenarios/holdout`` and
``scenarios/holdout_lr``, ``scenarios/holdout_early``, ``scenarios/holdout_late``,
``scenarios/holdout_late2``, ``holdout_late3``, ``holdout_late4``, ``holdout_late5`` (written by
people who had not read the code) — with ``--keras``,
``scenarios/keras`` and ``scenarios/keras/holdout`` — runs under
``nanguard run --json`` (policy ``raise``). For a failing scenario the table gives the step of its
first non-finite value, the step of the first early warning and the lead (how many steps before);
for a healthy one, any warning is a false alarm. Scored as the issue asks: among failing scenarios
whose first NaN comes at step 5 or later, the share warned 3 or more steps ahead; among healthy
ones, the share with no warning. Benchmarks never gate: the exit status is always 0.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from diagnose import SCENARIOS_DIR, Scenario, _env, discover, nanguard_command

DIRS = (SCENARIOS_DIR, SCENARIOS_DIR / "holdout", SCENARIOS_DIR / "holdout_lr", SCENARIOS_DIR / "holdout_early",
        SCENARIOS_DIR / "holdout_late", SCENARIOS_DIR / "holdout_late2", SCENARIOS_DIR / "holdout_late3",
        SCENARIOS_DIR / "holdout_late4", SCENARIOS_DIR / "holdout_late5")
KERAS_DIRS = (SCENARIOS_DIR / "keras", SCENARIOS_DIR / "keras" / "holdout")
MIN_STEP, MIN_LEAD = 5, 3


def run(scenario: Scenario) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="nanguard-early-") as tmp:
        path = os.path.join(tmp, "run.json")
        try:
            subprocess.run(nanguard_command(scenario.path, path, "raise"), cwd=tmp, env=_env(),
                           capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            pass
        log = json.loads(Path(path).read_text()) if os.path.exists(path) else {}
    events, warnings = log.get("events") or [], log.get("warnings") or []
    first = events[0]["step"] if events else None
    w = warnings[0] if warnings else None
    return {"name": scenario.name, "suite": scenario.path.parent.name, "healthy": scenario.expect.healthy,
            "first_nan": first, "first_warning": w["step"] if w else None,
            "kind": w["kind"] if w else None, "kinds": [x["kind"] for x in warnings],
            "lead": first - w["step"] if (w and first is not None) else None, "has_log": bool(log),
            "projected": [x.get("projected_step") for x in warnings]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--keras", action="store_true", help="the Keras scenarios instead of the torch ones")
    p.add_argument("--only", nargs="+", metavar="NAME",
                   help="only the scenarios whose name starts with one of these (the score is then theirs)")
    a = p.parse_args()
    scenarios = [s for d in (KERAS_DIRS if a.keras else DIRS) for s in discover(directory=d)
                 if not a.only or s.name.startswith(tuple(a.only))]
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        rows = list(pool.map(run, scenarios))
    print(f"# python benchmarks/early.py --jobs {a.jobs}{' --keras' if a.keras else ''}\n")
    print("| scenario | first NaN step | first warning step | lead | kind | projected step |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if r["healthy"]:
            continue
        lead = "-" if r["lead"] is None else str(r["lead"])
        warned = "-" if r["first_warning"] is None else r["first_warning"]
        suite = "keras/holdout" if a.keras and r["suite"] == "holdout" else r["suite"]
        shown = [p for p in r["projected"] if p is not None]
        print(f"| {suite}/{r['name']} | {r['first_nan']} | {warned} | {lead} "
              f"| {r['kind'] or '-'} | {', '.join(map(str, shown)) or '-'} |")
    late = [r for r in rows if not r["healthy"] and r["first_nan"] is not None and r["first_nan"] >= MIN_STEP]
    ahead = [r for r in late if r["lead"] is not None and r["lead"] >= MIN_LEAD]
    healthy = [r for r in rows if r["healthy"]]
    alarms = [r for r in healthy if r["first_warning"] is not None]
    print(f"\nfailing scenarios whose first NaN is at step {MIN_STEP} or later: {len(late)}; "
          f"warned {MIN_LEAD}+ steps ahead: {len(ahead)} ({100 * len(ahead) / max(len(late), 1):.0f} %)")
    print(f"healthy scenarios: {len(healthy)}; with a warning: {len(alarms)}"
          + (" (" + ", ".join(f"{r['name']}: {'/'.join(r['kinds'])}" for r in alarms) + ")" if alarms else ""))
    # every projection a warning printed (a step where float32 overflows, a margin reaches its
    # edge, the loader reaches a bad row), against the step the run made its first NaN
    pairs = [(p, r["first_nan"]) for r in rows if not r["healthy"] and r["first_nan"]
             for p in r["projected"] if p is not None]
    near = [p for p, f in pairs if f / 2 <= p <= 2 * f]
    print(f"projected steps printed on failing runs: {len(pairs)}; within 2x of the first NaN: {len(near)}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
