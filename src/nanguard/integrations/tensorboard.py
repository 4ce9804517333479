"""TensorBoard: nanguard's per-step scalars and its events beside your own curves.

``nanguard run --tensorboard DIR`` uses it; in your own loop::

    guard = nanguard.attach(model, optimizer)
    tb = TensorBoardLogger("runs/exp1")
    tb.watch(guard)              # after every step: loss, gradient norm, lr, update ratio, events
    ...
    tb.close()                   # the findings and recoveries as text, then flush

Scalars go under ``nanguard/`` (``nanguard/loss``, ``nanguard/grad_norm``,
``nanguard/param_norm``, ``nanguard/lr``, ``nanguard/update_ratio``, ``nanguard/nonfinite``,
``nanguard/skipped``), at the guard's step; findings and recoveries as text (TensorBoard's text
plugin). The event file is written with the ``tensorboard`` package's own record writer and
protocol buffers (:class:`EventFileWriter`), which need neither torch nor TensorFlow:
``torch.utils.tensorboard.SummaryWriter`` goes through ``tensorboard.compat.tf``, which imports
TensorFlow whenever it is installed (the seed demo under ``nanguard run --tensorboard``: 19–22 s
and 812 MB peak RSS with it, 9.5–11 s and 326 MB with this writer). A non-finite loss is written
as is: TensorBoard shows it as NaN/Inf at that step.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections import deque
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
    """Writes nanguard's history to a TensorBoard log directory."""

    def __init__(self, logdir: str) -> None:
        self.logdir = logdir
        self.writer = EventFileWriter(logdir)
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
        for w in getattr(log, "warnings", None) or []:
            self.writer.add_text("nanguard/warning", f"{w.get('kind')}: {w.get('message')}",
                                 int(w.get("step") or 0))
        self.writer.add_text("nanguard/status", str(log.status), log.steps)

    def close(self, log: Any = None) -> None:
        if log is not None:
            self.log_run(log)
        self.writer.flush()
        self.writer.close()
