"""What the torch locator knows about one aten op: its schema (which arguments it writes) and its
traits from the core table (:mod:`nanguard.core.ops`).

Read on every op the locator sees, so the answer is cached per ``OpOverload``; the cache is
emptied when :func:`nanguard.register_op_traits` changes the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.ops import canonical_op, on_traits_change, op_traits

__all__ = ["OpInfo", "op_info"]


@dataclass
class OpInfo:
    """One aten op as the locator reads it."""

    names: list[str]  # argument names, in schema order
    mutated: list[int]  # positions of arguments written in place
    mutated_kw: list[str]
    inplace: bool
    canonical: str  # ``log`` for ``aten.log_.default``
    packet: str  # ``log_``
    name: str  # ``aten.log_.default``
    safe: bool  # cannot make a non-finite value from finite inputs
    explains: bool  # its output explains a later singularity (softmax before a log)
    self_explains: bool  # an in-place variant overwrites what explains a singular result
    selects: bool  # takes part of a tensor (the batch is what comes out of ``data[i]``)
    moves: bool  # out of place, only moves a value: a literal passing through stays one
    relu: bool
    reads: bool
    uninitialized: bool  # returns memory nothing wrote (``empty``): never checked
    aux_outputs: bool  # returns several tensors, the first the result (layer norm: out, mean, rstd)  # copies a value into Python (``.item()``)


_CACHE: dict[Any, OpInfo] = {}
on_traits_change(_CACHE.clear)


def op_info(func: Any) -> OpInfo:
    """The :class:`OpInfo` of an ``OpOverload`` (cached)."""
    info = _CACHE.get(func)
    if info is not None:
        return info
    schema = func._schema
    args = schema.arguments
    written = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
    name = str(func)
    canonical = canonical_op(name)
    traits = op_traits(name if name.startswith(("aten.", "prims.")) else None, qualified=schema.name)
    inplace = bool(written)
    info = OpInfo(
        names=[a.name for a in args],
        mutated=[i for i in written if not args[i].kwarg_only],
        mutated_kw=[args[i].name for i in written if args[i].kwarg_only],
        inplace=inplace,
        canonical=canonical,
        packet=name.split(".")[1] if name.count(".") >= 2 else name,
        name=name,
        safe=traits.safe,
        explains=traits.explains,
        self_explains=traits.self_explains,
        selects=traits.selects,
        moves=traits.moves and not inplace,
        relu=traits.relu,
        reads=traits.reads,
        uninitialized=traits.uninitialized,
        aux_outputs=len(schema.returns) > 1,
    )
    _CACHE[func] = info
    return info
