"""Before the first training step: how often the script called torch, per line and per model.

A program that never reaches ``backward()`` or an optimizer step (a numerical routine in a loop,
an inference script) gives the guard nothing to watch. :class:`ScriptCalls` counts, until the
first step ends, the ops the step recorder's tape sees outside any module (per source line) and
the top-level model calls; after ``after`` of them with grad enabled it calls ``on_due`` once
(the session then checks every op, as ``--trace`` does). A finding made before any step is then
named by these counts — the 344th run of its line — instead of "step 0".

Counting is one dict update per op the tape already records (it has the line), so it costs
nothing the recorder does not already pay; it stops at the end of the first step.
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.source import SourceLocation

__all__ = ["FORWARD_ONLY_AFTER", "LOOP_RUNS", "ScriptCalls"]

#: torch calls with grad enabled (ops outside modules and model calls) with no backward() or
#: optimizer step after which a script counts as forward-only. Building a model runs its
#: initialisation under ``no_grad`` (not counted); a training script's first step comes after a
#: few dozen such calls (a batch prepared, one forward, a loss), while a loop of arithmetic
#: reaches this within a few hundred iterations.
FORWARD_ONLY_AFTER = 1000
#: runs of one source line (an op outside modules, grad enabled) with no step after which a
#: script counts as forward-only sooner: a loop that is not training. A training loop reaches its
#: first ``backward()`` in its first iteration; a loop that builds a dataset sample by sample is
#: checked op by op until training starts (at the end of the first step the check goes).
LOOP_RUNS = 10


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``11th``, ``344th``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n:,}{suffix}"


class ScriptCalls:
    """Counts per source line and per model until the first training step (see the module)."""

    __slots__ = ("_last", "_left", "checked_from", "complete", "lines", "on_due", "ops", "unclear")

    def __init__(self, after: int = FORWARD_ONLY_AFTER,
                 on_due: Callable[[], None] | None = None) -> None:
        self._left = after
        self.on_due = on_due
        self.lines: dict[tuple[str, int], int] = {}
        self.ops = 0
        self._last: tuple[tuple[str, int] | None, int] = (None, -1)
        self.unclear: set[tuple[str, int]] = set()
        #: false once the tape went off outside modules before the first step (a rollout or
        #: evaluation loop disarms it): the line counts may then miss runs, and are not said
        self.complete = True
        #: where and at which run of its line ``on_due`` was called
        self.checked_from: tuple[SourceLocation | None, int, int] | None = None

    def op(self, site: tuple[SourceLocation, int] | None, grad: bool) -> None:
        """An op outside any module is about to run at ``site`` (its line and bytecode offset;
        told by the tape, inside its dispatch: ``on_due`` may push a dispatch mode there, which
        then sees this op too). The ops of one run of a line count once: a run starts when the
        line changes or the offset does not rise (the loop came round)."""
        self.ops += 1
        runs = 0
        where = None
        if site is not None:
            where, offset = site
            key = (where[0], where[1])
            last_key, last_offset = self._last
            if key != last_key or offset < last_offset:
                self.lines[key] = self.lines.get(key, 0) + 1
            elif offset == last_offset:
                # one call made several ops (``torch.load``, a library function), or a loop of
                # one op came round: the runs of this line cannot be told apart, so they are
                # counted once and never said
                self.unclear.add(key)
            self._last = (key, offset)
            runs = self.lines[key]
        if grad:
            self._left -= 1
            if (self._left <= 0 or runs >= LOOP_RUNS) and self.on_due is not None:
                due, self.on_due = self.on_due, None
                self.checked_from = (where, runs, self.ops)
                due()

    def root(self, grad: bool) -> None:
        """A top-level model call began (told by the recorder's ``root_enter``). It counts, but
        ``on_due`` waits for the next op outside the model: a module call is no place to change
        the module hooks."""
        if grad:
            self._left -= 1

    def describe(self, source: str | None) -> str | None:
        """Which run of its line (a finding's ``"file.py:LINE"``) made a value before any step
        (``the 344th run of line 7``), or ``None`` when that is not known for sure (the line runs
        inside a module, whose ops the tape does not see, or the tape went off for a while)."""
        if not source or not self.complete:
            return None
        for (filename, line), n in self.lines.items():  # a finding names it relative to the cwd
            if source in (f"{filename}:{line}", SourceLocation(filename, line).short):
                if (filename, line) in self.unclear:
                    return None
                return f"the {ordinal(n)} run of line {line}"
        return None

    def why(self) -> str:
        """What made the script count as forward-only: ``train.py:7 ran 10 times`` or
        ``1,000 torch calls``."""
        where, runs, ops = self.checked_from or (None, 0, self.ops)
        if where is not None and runs >= LOOP_RUNS:
            return f"{SourceLocation(where[0], where[1]).short} ran {runs} times"
        return f"{ops:,} torch calls"

    def unchecked_before(self) -> str | None:
        """What the op-by-op check (started by ``on_due``) did not see: a finding made after it
        started may have had an earlier twin."""
        if self.checked_from is None:
            return None
        where, runs, ops = self.checked_from
        at = f" (the {ordinal(runs)} run of line {where[1]})" if where is not None and runs else ""
        return (f"every op from the {ordinal(ops)} torch call on{at}; the ones before were not "
                "checked: nanguard run --trace checks them all")
