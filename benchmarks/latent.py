"""``nanguard check`` on scripts with latent numerical bugs, and on safe controls.

    python benchmarks/latent.py               # every script in benchmarks/scenarios/latent, 50 steps
    python benchmarks/latent.py --steps 20 --json out.json

Each ``l*`` script holds one unsafe op on the path to the loss that never makes a NaN in the
steps checked (a ``log`` of a softmax, a ``sqrt`` of a distance without eps, …); ``h*`` scripts
are written the safe way. ``expected.json`` names the line of each hazard. A latent script
counts as *found* when a hazard ranked risky points at that line; a control as *clean* when no
hazard is ranked risky. The scripts were written by someone who had not read nanguard's code.
Benchmarks never gate: the exit status is always 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DIR = HERE / "scenarios" / "latent"


def run_check(script: Path, steps: int) -> tuple[int, list[dict[str, Any]]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "hz.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        r = subprocess.run([sys.executable, "-m", "nanguard", "check", "--steps", str(steps), "--json",
                            str(out), script.name], cwd=script.parent, capture_output=True, text=True,
                           env=env, timeout=600)
        hazards = json.loads(out.read_text())["hazards"] if out.exists() else []
    return r.returncode, hazards


def judge(exp: dict[str, Any], rc: int, hazards: list[dict[str, Any]]) -> dict[str, Any]:
    risky = [h for h in hazards if h["risk"] in ("high", "medium")]
    at_line = [h for h in risky if str(h.get("source") or "").endswith(f"{exp['script']}:{exp.get('line')}")]
    top = risky[0] if risky else None
    row = {"script": exp["script"], "latent": exp["latent"], "rc": rc, "risky": len(risky),
           "listed": len(hazards),
           "top": f"{top['risk']} {top['op']} {top['source']}" if top else "-",
           "why": (top["pattern"] or top["reasons"][0]) if top else "-"}
    row["ok"] = bool(at_line) if exp["latent"] else not risky
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--dir", default=str(DIR), help="a folder of scripts with its expected.json "
                   "(default: scenarios/latent; scenarios/latent_holdout is the second round)")
    a = p.parse_args()
    folder = Path(a.dir)
    expected = json.loads((folder / "expected.json").read_text())
    rows = []
    for exp in expected:
        rc, hazards = run_check(folder / exp["script"], a.steps)
        rows.append(judge(exp, rc, hazards))
    shown = f" --dir {os.path.relpath(folder, HERE.parent)}" if folder.resolve() != DIR else ""
    print(f"# python benchmarks/latent.py --steps {a.steps}{shown}\n")
    print("| script | latent bug | exit | risky / listed | first risky hazard | why | right |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['script']} | {'yes' if r['latent'] else 'no'} | {r['rc']} | {r['risky']} / {r['listed']} "
              f"| {r['top']} | {r['why']} | {'yes' if r['ok'] else 'NO'} |")
    lat = [r for r in rows if r["latent"]]
    ctl = [r for r in rows if not r["latent"]]
    print(f"\nfound at its line: {sum(r['ok'] for r in lat)}/{len(lat)}; "
          f"controls with nothing risky: {sum(r['ok'] for r in ctl)}/{len(ctl)}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
