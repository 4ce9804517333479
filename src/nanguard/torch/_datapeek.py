"""A look at the data a run will train on, before it gets there: non-finite values already held.

Runs **once per dataset**, when a ``DataLoader`` creates its iterator (before the first batch of
an epoch), and **once per run** over the script's own variables at the end of its first step
(then also the scale of that step's data, for the ``unscaled-data`` diagnosis).
It reads what is already in memory — the tensors and arrays a ``Dataset`` holds as attributes
(``TensorDataset.tensors``, ``self.x``, a list of per-sample tensors), and the float tensors and
arrays in the frames of the user's code (``x_all = torch.from_numpy(...)`` sliced into batches
by hand) — and never calls ``__getitem__``: no user code runs, no random number is drawn.

What counts, and how it is said, is :mod:`nanguard.core.datalook`'s (a few non-finite values
among many finite ones); this module says what a dataset holds and how a tensor is read.
Tensors in the autograd graph (weights, activations) are not data and are skipped.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

import numpy as np
import torch

from ..core.case import DataScale
from ..core.controller import StepController
from ..core.datalook import MAX_ELEMENTS, Counts, Reader, array_counts, is_array_data, warning
from ..core.early import NonFiniteData
from ..core.source import user_frames
from ._datascale import Collected, collect, measure, targets_beyond_output

__all__ = ["TORCH", "DataLook", "attributes", "counts", "is_data", "peek_dataset", "peek_frames"]

log = logging.getLogger("nanguard")


def counts(x: Any) -> Counts | None:
    """``(nan, inf, rows, first_row, elements)`` of a float tensor or array, ``None`` if all finite."""
    if not isinstance(x, torch.Tensor):
        return array_counts(np.asarray(x))
    if bool(torch.isfinite(x).all()):
        return None
    bad = ~torch.isfinite(x)
    nan = int(torch.isnan(x).sum())
    per_row = bad.reshape(bad.shape[0], -1).any(1) if x.dim() else bad.reshape(1)
    idx = torch.nonzero(per_row).flatten()
    return nan, int(bad.sum()) - nan, int(idx.numel()), int(idx[0]), x.numel()


def is_data(x: Any) -> bool:
    """A float tensor or array that is data: not in the autograd graph, not memory-mapped, not huge."""
    if isinstance(x, torch.Tensor):
        return (x.is_floating_point() and not x.requires_grad and x.grad_fn is None
                and x.layout == torch.strided and x.device.type != "meta" and 0 < x.numel() <= MAX_ELEMENTS)
    return is_array_data(x)


#: torch tensors (read on their device) and NumPy arrays
TORCH = Reader(is_data, counts, lambda x: x.numel() if isinstance(x, torch.Tensor) else int(x.size))


def attributes(dataset: Any, inner: bool = True) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of what a dataset holds: its tensors, arrays and lists of them, and
    (``inner``) one level into ``Subset``/``ConcatDataset`` (row numbers are then the inner
    dataset's)."""
    subs = getattr(dataset, "datasets", None) or ([dataset.dataset] if hasattr(dataset, "dataset") else [])
    for d in subs if inner else ():
        if d is not dataset and hasattr(d, "__dict__"):
            yield from attributes(d)
    tensors = getattr(dataset, "tensors", None)  # TensorDataset
    if isinstance(tensors, (tuple, list)):
        for i, t in enumerate(tensors):
            yield f"{type(dataset).__name__}.tensors[{i}]", t
    for k, v in vars(dataset).items() if hasattr(dataset, "__dict__") else ():
        if k != "tensors":
            yield f"{type(dataset).__name__}.{k}", v
            if isinstance(v, dict):
                for kk, vv in v.items():
                    yield f"{type(dataset).__name__}.{k}[{kk!r}]", vv


def peek_dataset(dataset: Any) -> list[NonFiniteData]:
    """The non-finite values ``dataset`` already holds (at a ``DataLoader``'s first iterator)."""
    found: list[NonFiniteData] = []
    for name, value in attributes(dataset):
        p = TORCH.peek(name, value)
        if p is not None:
            found.append(p)
    return found


def peek_frames(frames: list[FrameType]) -> list[NonFiniteData]:
    """The non-finite values the user's frames hold in their variables (locals and the
    module's globals, each value once)."""
    return TORCH.frames(frames)


def _projected(loader: Any, found: NonFiniteData, step: int) -> int | None:
    """The step whose batch holds the first bad row: known for a sequential, batched loader
    over the dataset that holds it (not through a ``Subset``) whose rows are its samples (a
    dataset of windows over one series has more rows than samples), within the first epoch."""
    from torch.utils.data import SequentialSampler

    ds, bs = loader.dataset, getattr(loader, "batch_size", None)
    if (not isinstance(getattr(loader, "sampler", None), SequentialSampler) or not bs
            or hasattr(ds, "dataset") or hasattr(ds, "datasets")):
        return None
    try:
        if len(ds) != found.total_rows:
            return None
    except TypeError:  # a dataset without __len__
        return None
    return step + found.first_row // int(bs)


class DataLook:
    """The guard's look at the data ahead (an observer: told when a ``DataLoader`` starts an
    epoch and when the first healthy step ends)."""

    def __init__(self, controller: StepController) -> None:
        self.controller = controller
        self._looked: weakref.WeakSet[Any] | None = None
        self.frames_looked = False
        #: the scale of the first step's data (read once, at its end): what a diagnosis of
        #: ``unscaled-data`` reads — the data as the run began, before any state it carries grew
        self._scale: DataScale | None = None
        self._tensors: Collected | None = None  # under the deferred watch: read at a failure
        self.scale_read = False

    def first_step_ended(self, captured: Sequence[tuple[Any, ...]] | None, deferred: bool | None) -> None:
        """At the end of the run's first step: the scale of its data (:mod:`._datascale`, from
        the recorder's capture), once — under the deferred GPU watch only the tensors are kept
        (one batch), read if a failure asks (a host read now would synchronise the step)."""
        if self.scale_read:
            return
        self.scale_read = True
        got = collect(captured)
        if deferred:
            self._tensors = got
        else:
            self._scale = measure(got)
            beyond = targets_beyond_output(captured, 0)
            if beyond is not None:
                self.controller.early.add(beyond)

    @property
    def scale(self) -> DataScale | None:
        """The scale of the first step's data (``None``: not read); asked at a failure only."""
        if self._tensors is not None:
            self._scale, self._tensors = measure(self._tensors), None
        return self._scale

    def loader_started(self, loader: Any, step: int) -> None:
        """A ``DataLoader`` created its iterator (an epoch starts, before its first batch): look
        once at what its dataset holds."""
        ds = getattr(loader, "dataset", None)
        if ds is None or "data-nonfinite" in {w.kind for w in self.controller.early.warnings}:
            return
        if self._looked is None:
            self._looked = weakref.WeakSet()
        try:
            if ds in self._looked:
                return
            self._looked.add(ds)
        except TypeError:  # a dataset that takes no weak reference: looked at each epoch
            pass
        try:
            found = sorted(peek_dataset(ds), key=lambda p: p.first_row)  # the earliest bad row first
            if found:
                self.controller.early.add(warning(found, step, "a dataset",
                                                   _projected(loader, found[0], step)))
        except Exception:  # a dataset attribute nanguard cannot read: the look is best-effort
            log.debug("nanguard: the look at a dataset failed", exc_info=True)
            return

    def look_at_frames(self, step: int, deferred: bool | None) -> None:
        """At the end of the first healthy step (``step``: the next one's index): once, the
        script's own tensors and arrays (a dataset it slices into batches by hand). Not on the
        deferred watch."""
        if self.frames_looked:
            return
        self.frames_looked = True
        if deferred:
            return  # the deferred GPU watch: a host read per tensor would synchronise the step
        try:
            found = peek_frames(user_frames(2))
        except Exception:  # a value nanguard cannot read: the look is best-effort
            log.debug("nanguard: the look at the script's variables failed", exc_info=True)
            return
        if found:
            self.controller.early.add(warning(found, max(step - 1, 0), "the script's variables", None))
