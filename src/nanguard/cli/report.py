"""``nanguard report run.json -o report.html``: the HTML report of a run, from its run log."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

__all__ = ["add_parser", "main"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="write the HTML report of a run from its JSON run log",
        description="Render the run log that `nanguard run --json PATH` wrote as one "
        "self-contained HTML page (works offline): the finding and its diagnosis, and plots of "
        "the loss, gradient norms, learning rate and update/weight ratio with the first "
        "non-finite step and every skip and rollback marked.",
    )
    p.add_argument("runlog", help="the run log (JSON, schema 1)")
    p.add_argument(
        "-o", "--output", metavar="PATH", help="where to write the report (default: RUNLOG.html)"
    )
    p.set_defaults(command="report")


def main(args: argparse.Namespace) -> int:
    from ..core.runlog import merge_ranks

    out = args.output or os.path.splitext(args.runlog)[0] + ".html"
    try:
        doc = merge_ranks(args.runlog)  # with the logs of the other ranks beside it, if any
    except FileNotFoundError:
        print(f"nanguard report: no such file: {args.runlog}", file=sys.stderr)
        return 2
    except (ValueError, json.JSONDecodeError) as exc:
        print(f"nanguard report: {args.runlog} is not a nanguard run log: {exc}", file=sys.stderr)
        return 2
    try:
        from ..core.report_html import write_report

        write_report(doc, out)
    except ImportError as exc:
        print(f"nanguard report: {exc}", file=sys.stderr)
        return 2
    print(f"nanguard: report written to {out}")
    return 0
