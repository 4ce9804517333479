"""TensorBoard: nanguard's per-step scalars and its events beside your own curves.

``nanguard run --tensorboard DIR`` uses it; in your own loop::

    guard = nanguard.attach(model, optimizer)
    tb = TensorBoardLogger("runs/exp1")
    tb.watch(guard)              # after every step: loss, gradient norm, lr, update ratio, events
    ...
    tb.close()                   # the findings and recoveries as text, then flush

Scalars go under ``nanguard/`` (``nanguard/loss``, ``nanguard/grad_norm``,
``nanguard/param_norm``, ``nanguard/lr``, ``nanguard/update_ratio``, ``nanguard/nonfinite``,
``nanguard/skipped``), at the guard's step, written with ``torch.utils.tensorboard.SummaryWriter``
(the ``tensorboard`` package must be installed). A non-finite loss is written as is: TensorBoard
shows it as NaN/Inf at that step.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..core.history import StepRecord

__all__ = ["TensorBoardLogger"]


class TensorBoardLogger:
    """Writes nanguard's history to a TensorBoard log directory."""

    def __init__(self, logdir: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError(
                "--tensorboard needs the tensorboard package: pip install 'nanguard[tensorboard]' "
                "(or: pip install tensorboard)"
            ) from exc
        self.logdir = logdir
        self.writer = SummaryWriter(log_dir=logdir)
        self._written = -1
        self._ids: deque[int] = deque(maxlen=64)  # records written lately (a step may be redone)

    def watch(self, guard: Any) -> None:
        """Log ``guard.history`` after each of its steps (a ``guard.on_step_end`` callback)."""
        guard.on_step_end.append(lambda: self.log_new(guard.history))

    def log_step(self, rec: StepRecord) -> None:
        """One step's scalars (called once per step, after it was recorded)."""
        w = self.writer
        s = rec.step
        for tag, v in (("loss", rec.loss), ("grad_norm", rec.grad_norm),
                       ("param_norm", rec.param_norm), ("lr", rec.lr),
                       ("update_ratio", rec.update_ratio)):
            if v is not None:
                w.add_scalar(f"nanguard/{tag}", float(v), s)
        w.add_scalar("nanguard/nonfinite", 0.0 if rec.finite else 1.0, s)
        w.add_scalar("nanguard/skipped", 1.0 if rec.skipped else 0.0, s)
        self._written = max(self._written, s)
        self._ids.append(id(rec))

    def log_new(self, history: Any) -> None:
        """Every record of ``history`` newer than the last one written."""
        for rec in history.last(8):
            if id(rec) not in self._ids and rec.step >= self._written:
                self.log_step(rec)

    def log_run(self, log: Any) -> None:
        """At the end of a run: steps not written yet, then each finding and recovery as text."""
        if log.history is not None:
            for rec in log.history:
                if rec.step > self._written:
                    self.log_step(rec)
        from ..core.render import format_finding

        for i, (f, d) in enumerate(log.events):
            text = format_finding(f, d)
            self.writer.add_text("nanguard/finding", "```\n" + text + "\n```", f.step or 0)
            if i == 0 and d is not None:
                self.writer.add_text("nanguard/cause", d.cause.value, f.step or 0)
        for r in log.recoveries:
            self.writer.add_text("nanguard/recovery", f"step {r.get('step')}: {r.get('description')} "
                                 f"({r.get('reason')})", int(r.get("step") or 0))
        self.writer.add_text("nanguard/status", str(log.status), log.steps)

    def close(self, log: Any = None) -> None:
        if log is not None:
            self.log_run(log)
        self.writer.flush()
        self.writer.close()
