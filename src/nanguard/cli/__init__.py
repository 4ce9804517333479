"""``nanguard`` command line: one module per subcommand (``demo``, ``run``, ...)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from .._version import __version__

__all__ = ["main"]

#: subcommand -> module in this package
COMMANDS = {
    "check": "check",
    "demo": "demo",
    "env": "env",
    "report": "report",
    "run": "run",
    "scan": "scan",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nanguard",
        description="Catch the first NaN/Inf of a training run at the op that made it, "
        "explain why, and keep the run alive.",
    )
    parser.add_argument("--version", action="version", version=f"nanguard {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for _name, mod in COMMANDS.items():
        importlib.import_module(f"{__name__}.{mod}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    if extra:  # the subcommand's own usage, not the top level's: `nanguard run --bogus x.py`
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    mod = importlib.import_module(f"{__name__}.{COMMANDS[args.command]}")
    try:
        status = int(mod.main(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here when the output was buffered
    except BrokenPipeError:
        return _closed_pipe()
    return status


#: the exit status of a process that wrote to a closed pipe, as a shell reports ``cat f | head``
EXIT_CLOSED_PIPE = 128 + 13  # SIGPIPE


def _closed_pipe() -> int:
    """``nanguard scan ... | head -2``: the reader went away. End quietly, as Unix tools do:
    no traceback, and stdout pointed at /dev/null so that the flush at exit cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_CLOSED_PIPE


if __name__ == "__main__":
    sys.exit(main())
