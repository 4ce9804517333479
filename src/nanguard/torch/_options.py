"""How a locator is configured: one frozen options object, given when it is made.

:func:`nanguard.locate`, ``nanguard run --trace``, the replay of a failing step and the replay of
an update each pass a :class:`LocateOptions`; nothing is set on a running locator from outside.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType
from typing import Literal

import torch

__all__ = ["LocateOptions"]

_VALID = {
    "on_sink": ("raise", "record"),
    "unused": ("report", "ignore"),
    "phase": ("auto", "optimizer"),
    "optimizer": ("fast", "op_by_op"),
}


@dataclass(frozen=True)
class LocateOptions:
    """What a locator does, fixed for its lifetime.

    Attributes:
        on_sink: ``"raise"`` raises :class:`~nanguard.NonFiniteError` at the first finding
            (``locate()``, ``--trace``); ``"record"`` appends it to ``findings`` and goes on (the
            replays).
        unused: ``"report"``: a non-finite value that an op made from finite inputs is a finding
            wherever it goes — when it reaches the loss, a gradient or a weight, when Python
            reads it (``.item()``), or, at the end of the block / step / script, when it is still
            unused or was dropped unused; only values that every later use made finite again
            (a causal mask's ``-inf`` through a softmax) and deliberate constants are let be.
            ``"ignore"``: only values that reach the loss, a gradient or a weight (the replays,
            which re-run a step that already failed there).
        step: the step number findings carry (a ``--trace`` run advances it at each step end).
        detected_by: the tier named in findings (``"trace"`` or ``"replay"``).
        phase: ``"optimizer"`` when the whole block is an optimizer update (the replay of one);
            ``"auto"`` tells forward, backward and optimizer apart as ops run.
        optimizer: ``"fast"`` runs an ``optimizer.step()`` untraced with one fused check after
            it, and op by op only when that check fails; ``"op_by_op"`` traces every op of it.
        deferred: keep finiteness flags on the device and read them once per 64 ops; ``None``:
            for CUDA tensors, and on the CPU too when ``NANGUARD_DEFERRED=1`` (how tests exercise
            the GPU path).
        frame_stop: code objects at which the search for the user's source line stops (the
            replay's own frames).
        is_grad: the replay's test "is this tensor (a view of) a replayed gradient?", returning
            the weight's name.
    """

    on_sink: Literal["raise", "record"] = "raise"
    unused: Literal["report", "ignore"] = "report"
    step: int | None = None
    detected_by: str = "trace"
    phase: Literal["auto", "optimizer"] = "auto"
    optimizer: Literal["fast", "op_by_op"] = "fast"
    deferred: bool | None = None
    frame_stop: frozenset[CodeType] = frozenset()
    is_grad: Callable[[torch.Tensor], str | None] | None = None
    #: the run of a source line an origin was made in, asked when it is made (``nanguard run``
    #: before any step: "the 110th run of line 11"); ``None``: not asked
    run_of: Callable[[str | None], str | None] | None = None
    #: under torch.distributed, a finding is recorded instead of raised and acted on at the
    #: step's check, where every rank agrees (``--trace`` under torchrun: a rank that raised
    #: alone would leave the others waiting in a collective)
    defer_across_ranks: bool = False

    def __post_init__(self) -> None:
        for name, valid in _VALID.items():
            value = getattr(self, name)
            if value not in valid:
                raise ValueError(f"LocateOptions.{name}={value!r}; valid values: {', '.join(map(repr, valid))}")
