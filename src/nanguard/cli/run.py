"""``nanguard run [options] script.py [args...]``: guard an unmodified training script."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..core.config import POLICIES, policy_from_env


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a training script under guard, unchanged",
        usage="%(prog)s [options] script.py [args ...]",
        description="Run SCRIPT as `python SCRIPT ARGS...` would, with nanguard watching every "
        "step. On the first non-finite value: print where it was made, why, and what to change, "
        "and exit with status 3 (policy 'raise').",
    )
    p.add_argument(
        "--policy",
        choices=POLICIES,
        default=None,
        help="what to do on a non-finite value: raise (stop, default), skip (drop the update), "
        "recover (skip, roll back, back off the learning rate, clip, drop bad samples). "
        "Default: $NANGUARD_POLICY or raise.",
    )
    p.add_argument("--json", metavar="PATH", help="write the run log (schema 1) to PATH")
    p.add_argument("--report", metavar="PATH", help="write a self-contained HTML report to PATH")
    p.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="write per-step scalars (loss, gradient norm, lr, update ratio) and events to DIR "
        "for TensorBoard",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="check every op (slower): for code that never calls an optimizer or backward()",
    )
    # optional for argparse only: a missing script gets its own message (argparse would say
    # "required: script, args", though args is optional)
    p.add_argument("script", nargs="?", help="the Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    p.set_defaults(command="run", run_parser=p)


def main(args: argparse.Namespace) -> int:
    from ..runner import RunOptions, run_script

    if not args.script:
        args.run_parser.error("the script to run is missing: nanguard run [options] script.py "
                              "[args...]")

    try:
        policy = args.policy or policy_from_env()
    except ValueError as exc:
        print(f"nanguard run: {exc}", file=sys.stderr)
        return 2
    opts = RunOptions(
        policy=policy, json_path=args.json, report_path=args.report, trace=args.trace,
        tensorboard_dir=args.tensorboard,
    )
    try:
        return run_script(args.script, args.args, opts)
    except ImportError as exc:  # an optional part (--tensorboard) is not installed
        print(f"nanguard run: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # --tensorboard DIR cannot be written (checked before the script)
        print(f"nanguard run: --tensorboard {args.tensorboard}: cannot write there: "
              f"{exc.strerror or exc} (nothing was run)", file=sys.stderr)
        return 2
