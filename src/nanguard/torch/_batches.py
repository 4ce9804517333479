"""Which dataset rows a batch holds, and under which key of the batch a tensor came.

A ``DataLoader`` iterator asks its sampler for each batch's indices (``_next_index``) before it
fetches the batch, in order, ahead of time when workers prefetch; batches come back in that
order (unless the loader was made with ``in_order=False``). The wrapper keeps each iterator's
indices in a queue and, when ``__next__`` hands a batch out, remembers it with its indices: one
list append and one pop per batch, nothing per sample. A data finding then reads it, once, to
say ``dataset index 29 (sample 5 of the batch)`` and ``the batch's `labels` ``, where the
position in a shuffled batch alone tells a user nothing.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ._datapeek import attributes, counts, is_data
from ._untraced import untraced

__all__ = ["batch_source", "handed_out", "next_index", "stored_row_finite"]

#: the last batch a DataLoader handed out: (its sampler's indices or None, the batch, the dataset)
_LAST: list[tuple[list[Any] | None, Any, Any] | None] = [None]
_QUEUE = "_nanguard_indices"


def next_index(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``_BaseDataLoaderIter._next_index``: the indices of a batch about to be fetched."""
    @functools.wraps(fn)
    def _next_index(self: Any) -> Any:
        idx = fn(self)
        kept = self.__dict__.get(_QUEUE)
        sampler = self.__dict__.get("_sampler_iter")
        if kept is None or kept[0] is not sampler:  # a new epoch (or the first): a new queue
            kept = (sampler, deque())
            self.__dict__[_QUEUE] = kept
        kept[1].append(idx)
        return idx

    return _next_index


def handed_out(it: Any, batch: Any) -> None:
    """After ``__next__`` of iterator ``it`` returned ``batch``."""
    kept = it.__dict__.get(_QUEUE)
    idx = kept[1].popleft() if kept and kept[1] else None
    if getattr(it, "_in_order", True) is False:
        idx = None  # batches come back as workers finish them: no order to pair them by
    _LAST[0] = (idx if isinstance(idx, list) else None, batch, getattr(it, "_dataset", None))


def forget() -> None:
    _LAST[0] = None


def _tensors(batch: Any, path: str = "", depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of a batch with their key as Python (``['labels']``, ``[1]``)."""
    if isinstance(batch, torch.Tensor):
        yield path, batch
    elif depth > 3:
        return
    elif isinstance(batch, dict):
        for k, v in batch.items():
            yield from _tensors(v, f"{path}[{k!r}]", depth + 1)
    elif isinstance(batch, (list, tuple)):
        for i, v in enumerate(batch):
            yield from _tensors(v, f"{path}[{i}]", depth + 1)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``b`` is ``a`` or a view of it with the same rows (``x.flatten(1)``: one storage), or
    holds the same values, NaN where ``a`` has NaN (a copy the replay made)."""
    if a is b:
        return True
    if a.dim() == 0 or b.dim() == 0 or a.shape[0] != b.shape[0]:
        return False
    if (a.device == b.device and a.numel() == b.numel()
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()):
        return True
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    return bool(torch.equal(torch.isnan(a), torch.isnan(b))) and bool(
        torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)))


@untraced
def batch_source(t: torch.Tensor) -> dict[str, Any] | None:
    """Where the non-finite tensor ``t`` (a step's input) came from: ``{"key": "['labels']",
    "rows": [dataset indices by position]}`` when the last batch a DataLoader handed out holds
    it (each only when known); ``None`` when no loader's batch does. Read at a data finding."""
    last = _LAST[0]
    if last is None:
        return None
    rows, batch, _dataset = last
    with torch.no_grad():
        found = next((k for k, v in _tensors(batch) if _same(v, t)), None)
    if found is None:
        return None
    out: dict[str, Any] = {"dataset": _dataset}
    if found and not isinstance(batch, torch.Tensor):
        out["key"] = found
    if (rows is not None and t.dim() > 0 and t.shape[0] == len(rows)
            and all(isinstance(i, int) for i in rows)):
        out["rows"] = [int(i) for i in rows]
    return out


def _stored(dataset: Any) -> Iterator[Any]:
    """The per-sample data a dataset holds (what the data look reads, not inside a ``Subset``,
    whose rows are another dataset's): its float tensors and arrays one row per sample."""
    try:
        n = len(dataset)
    except TypeError:
        return
    for _name, v in attributes(dataset, inner=False):
        if is_data(v) and len(v.shape) and v.shape[0] == n:
            yield v


@untraced
def stored_row_finite(dataset: Any, row: int) -> bool | None:
    """Is row ``row`` finite in every per-sample array ``dataset`` holds? ``None`` when it holds
    none (it reads files, or builds samples on the fly): then nothing is known."""
    seen = False
    for v in _stored(dataset):
        seen = True
        if counts(v[row]) is not None:
            return False
    return True if seen else None
