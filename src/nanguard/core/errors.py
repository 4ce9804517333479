"""Exceptions raised by nanguard, and how an error inside nanguard itself is handled."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from . import config

if TYPE_CHECKING:
    from .diagnosis import Diagnosis
    from .finding import Finding

__all__ = ["GiveUpError", "NonFiniteError", "internal_error"]

#: nanguard's logger: silent unless the application configures logging (a library's manners)
log = logging.getLogger("nanguard")
log.addHandler(logging.NullHandler())


def internal_error(what: str, exc: BaseException) -> str:
    """An error raised inside nanguard's own work (a replay, a trial, a look at the data):
    logged with its traceback on the ``nanguard`` logger, raised again under
    ``NANGUARD_STRICT=1`` (the test suite's switch), else returned as the words a finding or a
    note gives it — ``"the replay of this step failed: KeyError: 'x'"`` — so that a bug of ours
    is reported as ours and never as a statement about the user's run. Call it from an
    ``except`` block."""
    if config.strict():
        raise exc
    log.warning("nanguard: %s failed", what, exc_info=exc)
    return f"{what} failed: {type(exc).__name__}: {exc}"[:300]


class NonFiniteError(FloatingPointError):
    """A NaN or Inf reached the loss, the gradients or the weights.

    ``.finding`` says where it was made (op, phase, module, source line, step, input statistics);
    ``.diagnosis`` (when the run's history allowed one) says why and what to change. ``str(err)``
    is the readable explanation; ``err.__rich__()`` renders it as a panel.

    It subclasses :class:`FloatingPointError`, so code that already catches that keeps working.
    """

    def __init__(self, finding: Finding, diagnosis: Diagnosis | None = None) -> None:
        self.finding = finding
        self.diagnosis = diagnosis
        super().__init__(finding)

    def __str__(self) -> str:
        from .render import format_finding

        return format_finding(self.finding, self.diagnosis)

    def __reduce__(self) -> tuple[object, ...]:  # picklable across processes (DataLoader, DDP)
        return (type(self), (self.finding, self.diagnosis))

    def __rich__(self) -> object:
        from .render import finding_panel

        return finding_panel(self.finding, self.diagnosis)


class GiveUpError(NonFiniteError):
    """A recovery policy gave up: too many consecutive skips, or recoveries within a window.

    ``.attempts`` lists what was tried, in order.
    """

    def __init__(
        self,
        finding: Finding,
        diagnosis: Diagnosis | None = None,
        reason: str = "",
        attempts: list[str] | None = None,
    ) -> None:
        self.reason = reason
        self.attempts = list(attempts or [])
        #: the event that made the policy give up (``finding`` is the run's first one)
        self.last: tuple[Finding, Diagnosis | None] | None = None
        super().__init__(finding, diagnosis)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.finding, self.diagnosis, self.reason, self.attempts))

    def __str__(self) -> str:
        head = f"nanguard gave up: {self.reason}"
        if self.attempts:
            head += "\n  tried: " + "; ".join(self.attempts)
        return head + "\n" + super().__str__()
