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
        "-o", "--output", metavar="PATH",
        help="where to write the report (default: RUNLOG.html, never over an existing file; "
        "the folder must exist)"
    )
    p.set_defaults(command="report")


def _default_output(runlog: str) -> str:
    return os.path.splitext(runlog)[0] + ".html"


def main(args: argparse.Namespace) -> int:
    from ..core.outfile import check_writable
    from ..core.ranks import merge_ranks

    out = args.output or _default_output(args.runlog)
    if os.path.isdir(args.runlog):
        return _fail(f"{args.runlog} is a directory; give the run log's file "
                     "(nanguard run --json PATH wrote it)")
    try:
        doc = merge_ranks(args.runlog)  # with the logs of the other ranks beside it, if any
    except FileNotFoundError:
        return _fail(f"no such file: {args.runlog}")
    except (OSError, UnicodeDecodeError) as exc:
        return _fail(f"cannot read {args.runlog}: {exc}")
    except (ValueError, json.JSONDecodeError) as exc:
        return _fail(f"{args.runlog} is not a nanguard run log: {exc}")
    if not args.output and os.path.exists(out):
        return _fail(f"{out} already exists (an earlier --report?) and is kept: name the "
                     f"output with -o (-o {out} replaces it)")
    problem = check_writable(out)
    if problem:
        return _fail(f"cannot write the report: {problem}")
    try:
        from ..core.report_html import write_report

        write_report(doc, out)
    except ImportError as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"could not write {out}: {exc.strerror or exc}")
    except Exception as exc:  # a run log that passed the checks but still cannot be drawn
        return _fail(f"cannot draw the report of {args.runlog}: {type(exc).__name__}: {exc}")
    print(f"nanguard: report written to {out}")
    return 0


def _fail(message: str) -> int:
    print(f"nanguard report: {message}", file=sys.stderr)
    return 2
