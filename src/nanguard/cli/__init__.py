"""``nanguard`` command line: one module per subcommand (``demo``, ``run``, ...)."""

from __future__ import annotations

import argparse
import importlib
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
    return int(mod.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
