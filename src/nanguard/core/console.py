"""Terminal output shared by the run engine, the integrations and the subcommands: rich on a
terminal, plain text elsewhere."""

from __future__ import annotations

import sys
from typing import TextIO

from rich.console import Console

from .diagnosis import Diagnosis
from .finding import Finding
from .render import finding_panel, format_finding

__all__ = ["make_console", "print_finding"]


def make_console(file: TextIO | None = None) -> Console:
    """Rich on a terminal; 120 columns and no colour when redirected (logs, CI, pipes)."""
    f = file or sys.stdout
    tty = hasattr(f, "isatty") and f.isatty()
    return Console(file=f, highlight=False, soft_wrap=False, width=None if tty else 120)


def print_finding(console: Console, finding: Finding, diagnosis: Diagnosis | None) -> None:
    """A rich panel on a terminal; the same content as plain text when piped or redirected."""
    if console.is_terminal:
        console.print(finding_panel(finding, diagnosis))
    else:
        console.file.write(format_finding(finding, diagnosis) + "\n")
        console.file.flush()
