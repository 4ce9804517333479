"""Where a non-finite loss came from, read from its autograd graph before ``backward()`` frees it.

Runs in the guard's hook just before a ``backward()`` of a step whose ops the recorder did not
all keep (a rollout of hundreds of forwards with grad, where recording every op would cost more
than the step: see :class:`~nanguard.torch._recorder.StepRecorder`), and only when the loss it
is called on is not finite (one host read of the loss on such steps, none on others). The replay
cannot re-run such a step, but the graph still holds what each node saved for its gradient: the
input of a ``log``, the divisor of a division, the result of an ``exp``. The walk looks for

* an op that made a non-finite value from finite saved inputs: a singular op whose input meets
  its singular point (re-computed from the saved input: ``log`` of a saved 0), or an op that is
  not :attr:`~nanguard.core.ops.OpTraits.safe` whose saved result is non-finite (``exp``);
* a non-finite tensor with no autograd history that a node saved (a return, an advantage, an
  observation the script built without grad).

The earliest such node (autograd's sequence number) is the origin. What the graph does not keep
is the module and the source line: the finding says so and points to ``--trace``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..core.finding import Finding
from ..core.ops import forward_op_of_grad_fn, op_traits
from ..core.source import SourceLocation, assignment_chain, user_frames
from ._stats import checkable, finding_for, is_finite, tensor_stats

__all__ = ["graph_origin"]

#: nodes walked at most (a rollout of 1000 forwards of a small policy holds ~20 000)
MAX_NODES = 200_000
#: unary singular ops re-computed from their saved input
_RECOMPUTE = frozenset({"log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "acos",
                        "asin", "atanh", "acosh", "logit", "erfinv", "lgamma", "digamma"})
_DIVIDES = frozenset({"div", "fmod", "remainder"})  # a zero saved divisor (``other``)
_NOTE = ("this step's ops were not all recorded (a rollout of many forwards with grad); the op was "
         "found in the loss's autograd graph before backward() ran, which keeps no module or line: "
         "nanguard run --trace <script> names them")


def _saved(node: Any) -> list[tuple[str, torch.Tensor]]:
    """The tensors ``node`` saved for its gradient, by name (``self``, ``other``, ``result``)."""
    out: list[tuple[str, torch.Tensor]] = []
    for attr in dir(node):
        if not attr.startswith("_saved_"):
            continue
        try:
            v = getattr(node, attr)
        except RuntimeError:  # freed (a graph backward already ran through)
            continue
        name = attr[len("_saved_"):]
        if isinstance(v, torch.Tensor):
            out.append((name, v))
        elif isinstance(v, (list, tuple)):
            out.extend((f"{name}[{i}]", t) for i, t in enumerate(v) if isinstance(t, torch.Tensor))
    return out


def _nonfinite(t: torch.Tensor) -> bool:
    return checkable(t) and not is_finite(t)


def _op_candidate(node: Any, op: str, saved: list[tuple[str, torch.Tensor]]) -> torch.Tensor | None:
    """The non-finite value ``node``'s op made from finite saved inputs, if it shows one
    (``torch.zeros(0)`` where only the divisor shows it: a zero in a saved denominator)."""
    inputs = [(n, t) for n, t in saved if n != "result"]
    if any(_nonfinite(t) for _, t in inputs):
        return None  # it was handed a non-finite value: not where it was made
    result = next((t for n, t in saved if n == "result"), None)
    if result is not None and _nonfinite(result) and not op_traits(op).safe:
        return result
    if op in _RECOMPUTE and inputs and inputs[0][0] == "self" and checkable(inputs[0][1]):
        fn = getattr(torch, op, None)
        if fn is not None:
            out = fn(inputs[0][1].detach())
            if _nonfinite(out):
                return out
    if op in _DIVIDES:
        other = next((t for n, t in inputs if n == "other"), None)
        if other is not None and checkable(other) and bool((other == 0).any()):
            return torch.zeros(0)
    return None


def _walk(roots: Sequence[torch.Tensor]) -> list[Any]:
    nodes: list[Any] = []
    seen: set[int] = set()
    stack: list[Any] = [r.grad_fn for r in roots if isinstance(r, torch.Tensor) and r.grad_fn is not None]
    while stack and len(nodes) < MAX_NODES:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        nodes.append(n)
        stack.extend(f for f, _ in n.next_functions)
    return nodes


def graph_origin(roots: Sequence[torch.Tensor], step: int | None) -> Finding | None:
    """The finding of the earliest node of the roots' graph that made (or was handed, from
    outside the graph) a non-finite value; ``None`` when the graph shows none."""
    best: tuple[int, Finding] | None = None
    for node in _walk(roots):
        name = node.name()
        op = forward_op_of_grad_fn(name) or ""
        saved = _saved(node)
        if not saved:
            continue
        seq = int(node._sequence_nr())
        if best is not None and seq >= best[0]:
            continue
        found = _from_outside(saved, name, step)
        if found is None:
            out = _op_candidate(node, op, saved)
            if out is not None:
                found = finding_for(
                    out if out.numel() else None, "forward", f"aten.{op}", grad_fn=name, step=step,
                    reached="loss", detected_by="graph",
                    inputs=[tensor_stats(t, n) for n, t in saved if n != "result"][:4],
                    details={"note": _NOTE, "module_unknown": True})
        if found is not None:
            best = (seq, found)
    return best[1] if best is not None else None


def _from_outside(saved: list[tuple[str, torch.Tensor]], consumer: str, step: int | None) -> Finding | None:
    """A non-finite saved tensor without autograd history (built without grad, or a leaf that
    is not a weight): the value came into the graph from outside it."""
    for n, t in saved:
        if n == "result" or t.grad_fn is not None or isinstance(t, torch.nn.Parameter):
            continue
        if _nonfinite(t):
            # an element or a slice of a tensor the script built (``for R in returns``): the
            # whole of it is what the script made, and what it can look at
            whole = t._base if isinstance(t._base, torch.Tensor) and checkable(t._base) else t
            part = " (a view of it)" if whole is not t else ""
            f = finding_for(
                whole, "data", "input", step=step, reached="loss", detected_by="graph",
                details={"origin": "unrecorded", "note": _NOTE, "module_unknown": True,
                         "input_name": f"a tensor built without grad, the `{n}` of {consumer}{part}"})
            _name_in_script(f, whole)
            return f
    return None


_FROM_DATA = ("tensor(", "as_tensor(", "from_numpy(", "Tensor(", "FloatTensor(")


def _name_in_script(f: Finding, t: torch.Tensor) -> None:
    """The script's own variable that holds ``t`` (a local of a frame running the backward) and
    the lines that last assigned it, read from the source: the line where a tensor built from
    Python numbers (``torch.tensor(returns)``) entered the step, at no cost to healthy steps."""
    key = (t.untyped_storage().data_ptr(), tuple(t.shape))
    for frame in user_frames(3):
        name = next((k for k, v in frame.f_locals.items() if isinstance(v, torch.Tensor)
                     and (v.untyped_storage().data_ptr(), tuple(v.shape)) == key), None)
        if name is None:
            continue
        code = frame.f_code.co_filename
        chain = assignment_chain(code, frame.f_lineno, name)
        if not chain:
            return
        line, text = chain[0]
        f.source, f.source_code = SourceLocation(code, line).short, text
        made = next(((ln, c) for ln, c in chain if any(m in c for m in _FROM_DATA)), None)
        if made is not None:
            chain = chain[:chain.index(made) + 1]  # before it, the name held Python data
        steps = " ← ".join(f"line {ln}" for ln, _ in chain)
        why = (f"; line {made[0]} made it from Python numbers or an array (`{made[1]}`): look at "
               "those values" if made is not None else "")
        f.details["note"] = (f"the script's `{name}` holds it, last assigned at {steps} (read from "
                             f"the source; this step's ops were not recorded){why}")
        f.details["script_variable"] = name
        return
