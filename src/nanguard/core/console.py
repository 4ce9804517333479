"""Terminal output shared by the run engine, the integrations and the subcommands: rich on a
terminal, plain text elsewhere."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO

from rich.console import Console

from .diagnosis import Diagnosis
from .errors import GiveUpError, NonFiniteError
from .finding import Finding
from .render import finding_panel, format_finding, recovery_summary

__all__ = ["make_console", "print_finding", "print_stop"]


def make_console(file: TextIO | None = None) -> Console:
    """Rich on a terminal; 120 columns and no colour when redirected (logs, CI, pipes)."""
    f = file or sys.stdout
    tty = hasattr(f, "isatty") and f.isatty()
    return Console(file=f, highlight=False, soft_wrap=False, width=None if tty else 120)


def print_finding(console: Console, finding: Finding, diagnosis: Diagnosis | None,
                  first: bool = True) -> None:
    """A rich panel on a terminal; the same content as plain text when piped or redirected."""
    if console.is_terminal:
        console.print(finding_panel(finding, diagnosis, first))
    else:
        console.file.write(format_finding(finding, diagnosis, first=first) + "\n")
        console.file.flush()


def _same(a: Finding, b: Finding) -> bool:
    return (a.step, a.phase, a.op, a.module) == (b.step, b.phase, b.op, b.module)


def print_stop(console: Console, err: NonFiniteError, events: Sequence[tuple[Finding, Any]],
               recoveries: Sequence[dict[str, Any]], steps: int, policy: str) -> None:
    """What ``nanguard run`` prints when a run stopped on a non-finite value, in the terms of
    its run log: the finding that stopped it is "the first" only if it was; when a policy gave
    up (``GiveUpError``) the first event is shown (the origin of the trouble), then the give-up
    and what was done before it (the skips, rollbacks)."""
    earlier = [e for e in events if not _same(e[0], err.finding)]
    if isinstance(err, GiveUpError) and earlier:
        first_f, first_d = events[0]
        print_finding(console, first_f, first_d or err.diagnosis)
    else:
        print_finding(console, err.finding, err.diagnosis, first=not earlier)
    if not earlier and not isinstance(err, GiveUpError):
        return
    if isinstance(err, GiveUpError):
        # the error leads with the run's first event; the step it gave up at is its last one
        last_step = err.last[0].step if err.last is not None else err.finding.step
        head = (f"nanguard gave up at step {last_step} (policy {policy}): "
                f"{err.reason or 'too many non-finite steps'}:")
    else:
        head = (f"nanguard: before step {err.finding.step}, the run met non-finite values at "
                f"{len(earlier)} step{'s' if len(earlier) != 1 else ''} (policy {policy}):")
    text = recovery_summary(steps, list(recoveries), len(events), policy, header=head)
    if text:
        console.file.write("\n" + text + "\n")
        console.file.flush()
