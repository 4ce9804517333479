"""What ``nanguard run`` reads from a framework's session when the script ends (framework-free).

The torch and Keras sessions keep a guard (``self.guard``: ``step``, ``history``, ``findings``,
``recoveries``, ``context()``, ``verify``, ``violations``); this base turns it into the run log's
parts, and completes an error a tracer raised mid-step with the step and the diagnosis.
"""

from __future__ import annotations

from typing import Any

from .diagnosis import Diagnosis, diagnose
from .errors import NonFiniteError
from .finding import Finding
from .history import History

__all__ = ["GuardSession"]


class GuardSession:
    """The results of a guarded run, read at its end (after the script returned or raised)."""

    framework: str
    guard: Any

    @property
    def steps(self) -> int:
        return int(self.guard.step)

    @property
    def history(self) -> History:
        return self.guard.history

    @property
    def events(self) -> list[tuple[Finding, Diagnosis | None]]:
        return list(self.guard.findings)

    @property
    def recoveries(self) -> list[dict[str, Any]]:
        return list(self.guard.recoveries)

    def warnings(self) -> list[dict[str, Any]]:
        """The early warnings the run raised before any NaN (``core.early``)."""
        controller = getattr(self.guard, "controller", None)
        early = getattr(controller, "early", None)
        return [w.to_dict() for w in early.warnings] if early is not None else []

    def outcome(self) -> dict[str, Any] | None:
        """The judged outcome of the guard's recoveries, decided now that the script ended
        (``None``: the policy never acted on a non-finite step)."""
        controller = getattr(self.guard, "controller", None)
        if controller is None or not hasattr(controller, "run_ended"):
            return None
        out: dict[str, Any] | None = controller.run_ended(int(self.guard.step))
        return out

    def verify_notes(self) -> list[str]:
        """Under ``NANGUARD_VERIFY=1``: whether weights and optimizer state stayed finite."""
        if not self.guard.verify:
            return []
        if not self.guard.violations:
            return ["verify: weights and optimizer state stayed finite after every step"]
        return [f"verify: non-finite after step {v['step']}: {', '.join(v['tensors'])}"
                for v in self.guard.violations]

    def swallowed(self) -> tuple[NonFiniteError, str] | None:
        """The first error the guard raised, when the script caught it and went on (``try: ...
        except Exception: continue`` around its step): the error, and a note saying so."""
        controller = getattr(self.guard, "controller", None)
        got = controller.swallowed() if controller is not None else None
        if got is None:
            return None
        finding, diag, step = got
        n = int(getattr(controller, "steps_after_raise", 0))
        note = (f"the script caught nanguard's error at step {step} and went on for {n} more "
                f"step{'s' if n != 1 else ''}; the finding stands (exit status 3)")
        return NonFiniteError(finding, diag), note

    def complete(self, err: NonFiniteError) -> NonFiniteError:
        """Fill in what a tracer's error lacks (step, diagnosis) and remember it."""
        f = err.finding
        if f.step is None:
            f.step = self.guard.step
        if err.diagnosis is None:
            if not self.guard.history.healthy():
                f.details.setdefault("first_step", True)
            err.diagnosis = diagnose(f, self.guard.history, self.guard.context())
        if not any(x is f for x, _ in self.guard.findings):
            self.guard.findings.append((f, err.diagnosis))
        return err
