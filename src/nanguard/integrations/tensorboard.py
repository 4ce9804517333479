"""TensorBoard: nanguard's per-step scalars and its events beside your own curves.

``nanguard run --tensorboard DIR`` uses it; in your own loop::

    guard = nanguard.attach(model, optimizer)
    tb = TensorBoardLogger("runs/exp1")
    tb.watch(guard)              # at the end of each step: the scalars of the step two before
    ...
    guard.detach()               # the last step's weights are read here
    tb.close()                   # the steps not written yet, then flush

Scalars go under ``nanguard/``, one point per step at the guard's step: ``loss``, ``grad_norm``,
``lr``, ``nonfinite``, ``skipped`` at every step (``loss``/``lr`` when the guard saw them);
``param_norm`` (the norm of the weights the step's update left) and ``update_ratio``
(``|Δw|/|w|``) at the steps whose weights the guard read — on the CPU under policy ``raise`` not
every step (``docs/report.md`` says which): nothing is written for a step without a value. A
step's record is written :attr:`TensorBoardLogger.SETTLE` steps after it, when the guard has
filled it in. With ``nanguard run``'s run log, :meth:`TensorBoardLogger.close` adds the findings
and recoveries as text (TensorBoard's text plugin). The event file is written with the
``tensorboard`` package's own record writer and protocol buffers (:class:`EventFileWriter`),
which need neither torch nor TensorFlow: ``torch.utils.tensorboard.SummaryWriter`` goes through
``tensorboard.compat.tf``, which imports TensorFlow whenever it is installed (the seed demo
under ``nanguard run --tensorboard``: 19–22 s and 812 MB peak RSS with it, 9.5–11 s and 326 MB
with this writer). A non-finite loss is written as is: TensorBoard shows it as NaN/Inf at that
step.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from typing import Any

from ..core.history import StepRecord

__all__ = ["EventFileWriter", "TensorBoardLogger"]

_files = itertools.count()


class EventFileWriter:
    """One TensorBoard event file (``events.out.tfevents.*``) in ``logdir``: scalars and text,
    in the record format TensorBoard reads (length, masked CRC-32C, the ``Event`` proto, CRC)."""

    def __init__(self, logdir: str) -> None:
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer.record_writer import RecordWriter
        except ImportError as exc:
            raise ImportError(
                "--tensorboard needs the tensorboard package: pip install 'nanguard[tensorboard]' "
                "(or: pip install tensorboard)"
            ) from exc
        self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
        os.makedirs(logdir, exist_ok=True)
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
                f"{os.getpid()}.{next(_files)}")
        self.path = os.path.join(logdir, name)
        self._records = RecordWriter(open(self.path, "wb"))  # noqa: SIM115 (closed in close())
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def _write(self, event: Any) -> None:
        self._records.write(event.SerializeToString())

    def _summary(self, value: Any, step: int) -> None:
        summary = self._summary_pb2.Summary(value=[value])
        self._write(self._event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self._summary(self._summary_pb2.Summary.Value(tag=tag, simple_value=float(value)), step)

    def add_text(self, tag: str, text: str, step: int) -> None:
        """As TensorBoard's text plugin stores it (the tag gets ``/text_summary``, like
        ``SummaryWriter.add_text``)."""
        from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2
        from tensorboard.plugins.text import plugin_data_pb2

        pb = self._summary_pb2
        meta = pb.SummaryMetadata(plugin_data=pb.SummaryMetadata.PluginData(
            plugin_name="text", content=plugin_data_pb2.TextPluginData(version=0).SerializeToString()))
        tensor = tensor_pb2.TensorProto(
            dtype="DT_STRING", string_val=[text.encode("utf-8")],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(
                dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]))
        self._summary(pb.Summary.Value(tag=f"{tag}/text_summary", metadata=meta, tensor=tensor), step)

    def flush(self) -> None:
        self._records.flush()

    def close(self) -> None:
        if not self._records.closed:
            self._records.flush()
            self._records.close()


class TensorBoardLogger:
    """Writes nanguard's history to a TensorBoard log directory: each step's scalars once the
    guard has finished filling in its record (:attr:`SETTLE` steps later), the rest at the end."""

    #: a step's record is written at the end of the step this many steps later: the guard fills
    #: parts of a record in after its step ended. With policy ``raise`` the norm of the weights
    #: an update left is read with the next step's check; on a GPU (the deferred watch) that
    #: check is read one step later still, and with it the loss, the gradient norm and whether
    #: the step was finite.
    SETTLE = 2
    #: until the first ``optimizer.step()`` the torch guard counts ``backward()`` calls as steps
    #: (``nanguard run`` attaches before the optimizer exists) and withdraws them at it, to redo
    #: them as one optimizer step: up to this many such records are held back, never written
    PROVISIONAL = 64

    def __init__(self, logdir: str) -> None:
        self.logdir = logdir
        self.writer = EventFileWriter(logdir)
        self._last: StepRecord | None = None  # the record written last
        self._history: Any = None  # the watched guard's history (flushed by close())

    def watch(self, guard: Any) -> None:
        """Log ``guard.history`` at the end of each of its steps (a ``guard.on_step_end``
        callback): the records :attr:`SETTLE` steps old; :meth:`close` writes the rest."""
        self._history = guard.history
        watched = getattr(guard, "watch", None)  # the torch guard's WatchSet

        def after_step() -> None:
            if getattr(watched, "primary", True) is None and len(guard.history) <= self.PROVISIONAL:
                return  # no optimizer stepped yet: the records so far may be withdrawn
            self.log_new(guard.history)

        guard.on_step_end.append(after_step)

    def log_step(self, rec: StepRecord) -> None:
        """One step's scalars, each one the record has (nothing is made up for the others)."""
        w = self.writer
        s = rec.step
        for tag, v in (("loss", rec.loss), ("grad_norm", rec.grad_norm),
                       ("param_norm", rec.param_norm), ("lr", rec.lr),
                       ("update_ratio", rec.update_ratio)):
            if v is not None:
                w.add_scalar(f"nanguard/{tag}", float(v), s)
        w.add_scalar("nanguard/nonfinite", 0.0 if rec.finite else 1.0, s)
        w.add_scalar("nanguard/skipped", 1.0 if rec.skipped else 0.0, s)
        self._last = rec

    def log_new(self, history: Any, settle: int | None = None) -> None:
        """At the end of a step: the records of ``history`` not written yet, oldest first, but
        the newest ``settle`` (default :attr:`SETTLE`), which the guard may still fill in."""
        fresh = self._unwritten(history)
        for rec in reversed(fresh[self.SETTLE if settle is None else settle:]):
            self.log_step(rec)

    def _unwritten(self, history: Any) -> list[StepRecord]:
        """The records newer than the last one written, newest first: a walk back from the
        newest that stops at it (all of them when it is not there: withdrawn, or none yet)."""
        out = []
        for rec in history.newest(len(history)):
            if rec is self._last:
                break
            out.append(rec)
        return out

    def log_run(self, log: Any) -> None:
        """At the end of a run: steps not written yet, then each finding and recovery as text."""
        self.flush_steps(log.history)
        from ..core.render import format_finding

        for i, (f, d) in enumerate(log.events):
            text = format_finding(f, d)
            self.writer.add_text("nanguard/finding", "```\n" + text + "\n```", f.step or 0)
            if i == 0 and d is not None:
                self.writer.add_text("nanguard/cause", d.cause.value, f.step or 0)
        for r in log.recoveries:
            self.writer.add_text("nanguard/recovery", f"step {r.get('step')}: {r.get('description')} "
                                 f"({r.get('reason')})", int(r.get("step") or 0))
        for w in getattr(log, "warnings", None) or []:
            self.writer.add_text("nanguard/warning", f"{w.get('kind')}: {w.get('message')}",
                                 int(w.get("step") or 0))
        self.writer.add_text("nanguard/status", str(log.status), log.steps)

    def flush_steps(self, history: Any) -> None:
        """After the last step (the guard detached, its last reads done): every record of
        ``history`` not written yet, oldest first."""
        if history is not None:
            self.log_new(history, settle=0)

    def close(self, log: Any = None) -> None:
        """After the run: the steps not written yet (from ``log.history``, else the watched
        guard's), with a run log (``nanguard run``'s) its findings, recoveries, warnings and
        status as text; then the file is flushed and closed."""
        if log is not None:
            self.log_run(log)
        else:
            self.flush_steps(self._history)
        self.writer.flush()
        self.writer.close()
