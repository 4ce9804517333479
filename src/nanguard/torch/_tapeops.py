"""What the step recorder's tape needs to know about one call it records, from its name.

The tape (``_recorder._Tape``) is a ``TorchFunctionMode``: it sees ``F.cross_entropy(out, y)``
as one call (a ``TorchDispatchMode`` would see its three aten ops, each a Python round trip of
about 20 µs) and, since a function mode is popped while its handler runs, never the calls made
inside it. A replay runs the same call again under the locator, whose dispatch mode then sees
the aten ops and names the one that made a NaN. For aten ops (``OpOverload``: ``torch.ops``
calls) the schema is read; for everything else the name says it:

* **random** — the name holds ``rand``, ``normal``, ``dropout``, ... (the replay restores the
  RNG state first);
* **in place** — a name ending in ``_`` (``add_``, ``torch.relu_``), an in-place dunder
  (``__setitem__``, ``__iadd__``), ``inplace=True`` (``F.relu(x, inplace=True)``): the first
  argument is written; ``out=`` writes what it names;
* **passed through** — property getters and setters (``p.grad``, ``p.data``: the tensors they
  return are used as they are, as under the dispatch mode, which saw no op for them), and calls
  whose work is not the step's values (``backward``, ``item``, ``size``, ``register_hook``).

Runs inside the recorder's handler, for every call made outside modules while the tape is on.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RANDOM_WORDS", "mutated", "name_of", "passes", "random_and_writes"]

RANDOM_WORDS = ("rand", "normal", "bernoulli", "dropout", "multinomial", "uniform", "exponential",
                "cauchy", "geometric", "poisson", "random")

_IN_PLACE_DUNDERS = frozenset({
    "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
    "__ipow__", "__imatmul__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
})
#: names ending in ``_`` that write no values (a flag, a hook, sharing)
_NOT_WRITES = frozenset({"requires_grad_", "retain_grad_", "share_memory_", "pin_memory_"})
#: calls whose result is not one of the step's tensor values, or whose work another hook records
_PASS = frozenset({
    "__get__", "__set__", "__delete__", "backward", "register_hook", "retain_grad", "item", "tolist",
    "numel", "size", "dim", "stride", "storage_offset", "element_size", "data_ptr", "is_contiguous",
    "get_device", "__len__", "__bool__", "__int__", "__float__", "__index__", "__format__",
    "__repr__", "__hash__", "__reduce_ex__", "__array__", "numpy", "is_floating_point",
    "is_complex", "nelement", "untyped_storage", "_is_view", "__iter__", "__contains__",
})

_INFO: dict[Any, tuple[bool, bool]] = {}


def name_of(func: Any) -> str:
    """``add_`` for ``Tensor.add_``, ``cross_entropy`` for ``F.cross_entropy``, ``add`` for
    ``aten.add.Tensor``."""
    packet = getattr(func, "overloadpacket", None)
    if packet is not None:
        return str(getattr(packet, "__name__", ""))
    return str(getattr(func, "__name__", ""))


def passes(func: Any) -> bool:
    """Run it without recording it (see the module docstring)."""
    return (name_of(func) in _PASS or getattr(func, "namespace", None) == "profiler"
            or str(getattr(func, "_qualified_op_name", "")).startswith("profiler::"))


def random_and_writes(func: Any) -> tuple[bool, bool]:
    """(draws random numbers, may write an argument in place) — computed once per callable."""
    try:
        info = _INFO.get(func)
    except TypeError:  # not hashable
        info = None
    if info is None:
        name = name_of(func)
        schema = getattr(func, "_schema", None)
        if schema is not None:
            writes = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        else:
            writes = (name.endswith("_") and not name.startswith("__") and name not in _NOT_WRITES) \
                or name in _IN_PLACE_DUNDERS
        info = (any(w in name for w in RANDOM_WORDS), writes)
        try:
            _INFO[func] = info
        except TypeError:
            pass
    return info


def mutated(func: Any, args: Any, kwargs: Any, flat: Any) -> list[Any]:
    """The tensors a call writes in place (``self`` of ``add_``, ``out=``, the lists of foreach);
    ``flat`` lists the tensors in a nested argument."""
    kwargs = kwargs or {}
    schema = getattr(func, "_schema", None)
    out: list[Any] = []
    if schema is not None:
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                if a.kwarg_only:
                    if a.name in kwargs:
                        out.extend(flat(kwargs[a.name]))
                elif i < len(args):
                    out.extend(flat(args[i]))
                elif a.name in kwargs:
                    out.extend(flat(kwargs[a.name]))
        return out
    if "out" in kwargs and kwargs["out"] is not None:
        out.extend(flat(kwargs["out"]))
    if args and (random_and_writes(func)[1] or kwargs.get("inplace") is True):
        out.extend(flat(args[0]))
    return out
