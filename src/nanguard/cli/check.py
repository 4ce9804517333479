"""``nanguard check [--steps N] script.py [args...]``: latent numerical hazards, before they fire."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "main"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "check",
        help="list unsafe ops (log, sqrt, division, exp, float16) with their margin, before a NaN",
        usage="%(prog)s [--steps N] [--json PATH] script.py [args ...]",
        description="Run the first N optimizer steps of SCRIPT and list every unsafe op on the path "
        "to the loss with its margin to the singularity, its module and line, whether the margin is "
        "shrinking, and the stable form to use; risky ones first. Exit status 0: nothing risky; "
        "5: a risky hazard; 3: the script made a NaN during the check; 1: the script raised.",
    )
    p.add_argument("--steps", type=int, default=50, metavar="N",
                   help="optimizer steps to check, then stop the script (default 50)")
    p.add_argument("--json", metavar="PATH", help="write the hazards as JSON to PATH")
    p.add_argument("script", nargs="?", help="the Python script to check")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    p.set_defaults(command="check", check_parser=p)


def main(args: argparse.Namespace) -> int:
    from ..checker import check_script

    if not args.script:
        args.check_parser.error("the script to check is missing: nanguard check [--steps N] script.py")
    if args.steps < 1:
        args.check_parser.error("--steps must be at least 1")
    return check_script(args.script, args.args, args.steps, args.json)
