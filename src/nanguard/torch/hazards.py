"""The latent-hazard check for PyTorch: ``nanguard.check()`` / ``nanguard check script.py``.

A ``TorchDispatchMode`` that sees every aten op while the check runs (the first ``steps``
optimizer steps), and for the unsafe ones whose result reaches the loss — grad enabled and an
input on the autograd graph, outside ``optimizer.step()`` — hands the op's margin to the
framework-free :class:`~nanguard.core.hazards.HazardBook`: the smallest input of a ``log``,
``sqrt``, ``rsqrt``, ``reciprocal``, a divisor or a negative power, the distance of an ``acos``
/ ``asin`` / ``atanh`` input to ±1, the e-folds left before an ``exp`` overflows, the headroom of
a float16/bfloat16 result. An unsafe op on data only (grad enabled, nothing requiring grad yet:
a per-sample standardisation at the top of ``forward``) is held on its result, carried through
the data-only ops after it, and handed over when an op on the graph reads it; one already at
its singularity (``log`` of a causal ``tril``: a mask, ``-inf`` by design) is not. It also
remembers, weakly, which op made each tensor (four levels up), so the pattern an op was made by
— ``log`` of a softmax, ``sqrt`` of a sum of squares — is known when it runs.

It costs what a trace costs (a Python call per op and a reduction per unsafe op), so it is a
check run once over a few steps, not a watch.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..core.hazards import MAX, HazardBook
from ..core.ops import canonical_op
from ..core.source import user_frame
from . import _autograd, _fn_regions
from ._light_mode import LightMode
from ._modules import ModuleStack
from ._recorder import mutated_args
from ._recurrence import Gain, RecurrenceProbe
from ._rows import RowTrace

__all__ = ["CheckDone", "HazardCheck", "check", "raw_margins"]

#: a producer: (op, producers of its first two tensor inputs), kept four levels deep
Prod = tuple[str, tuple[Any, ...]]

_LOG = frozenset({"log", "log2", "log10"})
_ZERO = frozenset({"log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal"})
_SOFTMAX = frozenset({"_softmax", "softmax"})
_SUMS = frozenset({"sum", "mean"})
_SQUARES = frozenset({"pow", "mul", "square"})
#: ops that move or select values without changing them: a producer is seen through them
#: (``log(softmax(x).gather(1, y))`` is a log of a softmax)
_PASS = frozenset({
    "view", "_unsafe_view", "reshape", "squeeze", "unsqueeze", "expand", "permute", "transpose", "t",
    "clone", "contiguous", "alias", "detach", "gather", "index", "index_select", "select",
    "slice", "narrow", "take_along_dim", "flatten", "unflatten", "split", "split_with_sizes", "chunk",
    "unbind", "masked_select", "repeat", "lift_fresh",
})
_NORMS = frozenset({"linalg_vector_norm", "norm"})
_COMPARE = frozenset({"gt", "lt", "ge", "le"})
_ON_MODEL = " of the model's values"
#: producer labels of a comparison of the model's values: what a count of them is made by
_COUNTED = frozenset(c + _ON_MODEL for c in _COMPARE)
_PROBS = frozenset({"_softmax", "softmax", "exp", "sigmoid"})
_FLOORS = frozenset({"add", "clamp", "clamp_min"})  # ops that put a floor under a value
_LOW = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
          torch.float64: "float64"}
#: a low-precision result is worth listing only within this factor of the dtype's largest value
_LIST_HEADROOM = 1024.0
#: data-only observations carried on one tensor at most (a long chain of masks stays cheap)
_MAX_HELD = 16
#: a raw parameter's margin projected to reach 0 within this many steps is a hazard
_PARAM_AHEAD = 50
_RECURRENCE_FIX = ("h = h.detach() every k calls (truncated backprop through time), a smaller or "
                   "orthogonal recurrent init (nn.init.orthogonal_), or a gated cell (nn.GRUCell)")


_PASS_ALL = 1 << 30  # an ``in_optimizer`` count that makes a stale mode pass everything through


class CheckDone(BaseException):
    """Raised by the step hook after the last step checked (a ``BaseException``: a script's
    ``except Exception`` does not swallow it)."""


def _trunc(p: Prod | None, depth: int) -> Prod | None:
    if p is None:
        return None
    if depth == 0:
        return (p[0], ())
    return (p[0], tuple(_trunc(q, depth - 1) for q in p[1]))


def _ops(p: Prod | None) -> set[str]:
    """Every op name in a producer tree."""
    if p is None:
        return set()
    out = {p[0]}
    for q in p[1]:
        out |= _ops(q)
    return out


def _parents(p: Prod | None) -> set[str]:
    return {q[0] for q in p[1] if q is not None} if p is not None else set()


#: (pattern, stable form, edge): the pattern is risky when the margin is at or below ``edge``
#: (``None``: whatever the margin)
Pattern = tuple[str, str, float | None]
#: ops defined on [-1, 1] only, whose gradient is infinite at ±1
_UNIT = frozenset({"acos", "asin", "atanh"})
#: the producer label of a clamp strictly inside ±1 (a floor, and what guards an acos)
_CLAMP_INSIDE = "clamp(inside ±1)+eps"
_UNIT_PATTERN: Pattern = (
    "of a cosine-like value (inside ±1 only in exact arithmetic): rounding takes it past ±1 (NaN), "
    "and its gradient is infinite at ±1", "torch.acos(c.clamp(-1 + 1e-7, 1 - 1e-7))  # asin alike", None)


#: an ``exp`` computed in float16 (a ``.half()`` model; CPU autocast, which leaves ``exp`` in
#: float16 where CUDA's autocast runs it in float32): whatever its input is now, a learned value
#: has only 11.09 e-folds of room, not float32's 88.7
_HALF_EXP: Pattern = (
    "exp computed in float16: it overflows once its input passes 11.09 (float32's limit is 88.7)",
    "torch.exp(x.float())  # exp in float32, also under autocast", None)


def _pattern(op: str, prod: Prod | None, exponent: float | None = None) -> Pattern | None:
    """The pattern an unsafe op was made by (see :data:`Pattern`), or ``None``."""
    found = _match(op, prod, exponent)
    if found is None:
        return None
    if found[0].startswith("division by a sum"):
        # a count or a total: risky once it has come down to 1 (one masked element from 0)
        return (found[0], found[1], 1.0)
    return (found[0], found[1], None)


def _match(op: str, prod: Prod | None, exponent: float | None) -> tuple[str, str] | None:
    if prod is None:
        return None
    src, parents = prod[0], _parents(prod)
    if op in _LOG:
        if src in _SUMS and "exp" in parents and not _ops(prod) & {"amax", "max"}:
            # minus the max first (``m + log(exp(x - m).sum())``): the sum is at least 1
            return ("log of a sum of exp", "torch.logsumexp(x, dim)  # minus math.log(n) for a mean")
        if src in _SUMS and "mul" in parents and _ops(prod) & _PROBS:
            return ("log of a sum of products of probabilities (a mixture)",
                    "torch.logsumexp(log_weights + log_probs, dim=-1)")
        if src in _SOFTMAX:
            return ("log of a softmax", "torch.log_softmax(logits, dim=-1)  # or F.cross_entropy(logits, y)")
        if src == "sigmoid":
            return ("log of a sigmoid", "F.logsigmoid(z)  # or F.binary_cross_entropy_with_logits(z, y)")
        if src in ("rsub", "sub") and "sigmoid" in parents:
            return ("log of 1 - sigmoid (1 - sigmoid(z) is exactly 0 once sigmoid rounds to 1)",
                    "F.logsigmoid(-z)  # log(1 - sigmoid(z)), or F.binary_cross_entropy_with_logits")
        if src == "div" and "exp" in parents:
            return ("log of a hand-written softmax", "torch.log_softmax(x, dim=-1)")
        if src in ("add", "add+eps") and "exp" in parents:  # + 1 floors the log; the exp overflows
            return ("log(exp(x) + 1)", "F.softplus(x)")
    if op == "log1p" and src == "exp":
        return ("log1p(exp(x))", "F.softplus(x)")
    rooted = op == "sqrt" or (op == "pow" and exponent is not None and 0 < exponent < 1)
    if rooted and src in _SUMS and parents & _SQUARES:
        return ("sqrt of a sum of squares (its gradient is infinite where the sum is 0)",
                "torch.linalg.vector_norm(d, dim=-1)  # or (s + 1e-12).sqrt(), F.pairwise_distance")
    if op in ("rsqrt", "reciprocal", "div", "pow"):
        if src in ("std", "std_mean") and op == "div":
            return ("by a standard deviation without eps", "x / (std + 1e-5)  # or nn.LayerNorm")
        if src in ("var", "var_mean", "std") or (src in _SUMS and parents & _SQUARES and op != "div"):
            return ("of a variance without eps", "torch.rsqrt(var + 1e-5)  # or nn.LayerNorm / nn.RMSNorm")
        if src == "sqrt" and parents & {"var", "mean", "sum"}:
            return ("by a standard deviation without eps", "x / (std + 1e-5)  # or nn.LayerNorm")
        if op == "div" and src == "sum" and "exp" in parents and not _ops(prod) & {"amax", "max"}:
            return ("a hand-written softmax (exp / exp.sum): exp overflows for inputs above ~88",
                    "torch.softmax(x, dim=-1)")
        if op == "div" and src in _SUMS and parents & _COUNTED:
            return ("division by the number of the model's values that pass a test (the active "
                    "triplets, the violated margins): training drives it to 0",
                    "loss.sum() / n.clamp_min(1)  # or the mean over all of them")
        if op == "div" and src in _SUMS:
            return ("division by a sum (a count, a mask's total) that can be 0",
                    "x / s.clamp_min(1e-8)  # or s + eps; a masked mean: .clamp_min(1) on the count")
        if op == "div" and (src in _NORMS or (src == "mul" and parents & _NORMS)):
            return ("division by a norm that can be 0",
                    "F.normalize(x, dim=-1)  # or F.cosine_similarity(a, b, dim=-1, eps=1e-8)")
    return None


def _storage_ptr(t: torch.Tensor) -> int | None:
    """The address of ``t``'s storage (``None`` for one without: meta, a tensor subclass)."""
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def _newest(held: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Held observations, the newest per op site (a momentum buffer carries one site's every
    step), at most :data:`_MAX_HELD` of them, the newest kept."""
    by_site = {(h["op"], h["kind"], h["source"], h["module"]): h for h in held}
    return list(by_site.values())[-_MAX_HELD:]


def _inside_unit(args: Any) -> bool:
    """``c.clamp(-1 + 1e-7, 1 - 1e-7)``: both bounds given, strictly inside ±1."""
    bounds = args[1:3]
    return len(bounds) == 2 and all(isinstance(b, (int, float)) and not isinstance(b, bool) and abs(b) < 1
                                    for b in bounds)


def _positive_scalar(args: Any) -> bool:
    """``x + 1e-8``, ``x.clamp(min=1e-6)``: a positive constant beside the tensor."""
    return any(isinstance(a, (int, float)) and not isinstance(a, bool) and a > 0 for a in args[1:3])


def _guarded(prod: Prod | None) -> bool:
    """Was the input made with a floor (``+ eps``, a positive ``clamp``)? Its margin is then the
    floor's, however small: ``log(p + 1e-9)`` is finite for every ``p >= 0``."""
    return prod is not None and prod[0].endswith("+eps")


def _name(dtype: torch.dtype) -> str:
    return _NAMES.get(dtype, str(dtype).replace("torch.", ""))


class HazardMode(LightMode):
    """The check's dispatch mode (pushed for the whole check; see the module docstring)."""

    def __init__(self, book: HazardBook, modules: ModuleStack, params: WeakIdKeyDictionary | None = None,
                 recurrences: bool = True, raw: WeakIdKeyDictionary | None = None,
                 moving: bool = True) -> None:
        super().__init__()
        #: link a module's calls fed its own output and read their gradients (the check, and the
        #: watch's steps 1–2: the recurrence rule is calibrated on initial weights)
        self.recurrences = recurrences
        self.book, self.modules = book, modules
        self.prod: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.exp_keys: WeakIdKeyDictionary = WeakIdKeyDictionary()  # exp output -> its hazard
        self.in_optimizer = 0
        #: data-only tensors -> the observations of the unsafe ops that made them (``_held``
        #: while an op runs; ``None``: the op is on the graph, observations go to the book)
        self.pending: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._held: list[dict[str, Any]] | None = None
        self._updating = False  # the op being looked at runs under no_grad (``_no_grad``)
        #: the storages of the weights the graph read (``p.data.sub_(...)`` writes one through
        #: a tensor that is no leaf requiring grad), and who is told of a write into one by hand
        self.weights: set[int] = set()
        self.on_weight_write: Callable[[], None] | None = None
        self._region: _fn_regions.Region | None = None  # of the op being looked at
        self.rows = RowTrace()
        #: a parameter read by an unsafe op -> (step, margin) when first seen (shared by the
        #: modes of the watch's sampled steps)
        self.params: WeakIdKeyDictionary = WeakIdKeyDictionary() if params is None else params
        #: a parameter an unsafe op reads as it is (``sqrt(self.var)``, ``x / self.temperature``)
        #: -> {its hazard's key: (how its margin is read, the observation)}: what the watch
        #: follows at every step between its looks (shared like ``params``)
        self.raw: WeakIdKeyDictionary = WeakIdKeyDictionary() if raw is None else raw
        #: the raw-parameter pattern (:meth:`_moving`), from the margins of the steps looked at:
        #: the check's, and the watch's on steps 1–2; later, the watch follows such a parameter
        #: at every step instead
        self.moving = moving
        self.recurrence = RecurrenceProbe(modules)
        #: custom autograd Function class -> the module path its forward ran in (its backward
        #: runs in no module)
        self.fn_modules: dict[type, str] = {}
        self._regions = False  # the custom-Function wrappers held (``_fn_regions``)

    def __enter__(self) -> HazardMode:
        if self.recurrences:
            self.recurrence.start()
        if not self._regions:
            _fn_regions.enter()
            self._regions = True
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._release()
        super().__exit__(*exc)

    def _release(self) -> None:
        self.recurrence.stop()
        if self._regions:
            self._regions = False
            _fn_regions.leave()

    def retire(self) -> None:
        """Left on the stack under another mode: from now on every op passes through."""
        self.in_optimizer = _PASS_ALL
        self._release()

    def step_done(self) -> list[Gain]:
        """When a step's backward is done (before the book counts the step): how the gradient
        grew back through each recurrence of the step, into the book; the fits."""
        self.rows.new_step()
        gains = self.recurrence.collect()
        for g in gains:
            self._gain(g)
        return gains

    def _gain(self, g: Gain) -> None:
        at = g.overflow_at
        if not math.isfinite(at):
            return  # it shrinks going back: nothing to overflow
        self.book.observe(
            "recurrence", "recurrence", at, step=self.book.now, dtype=g.dtype, source=g.source,
            source_code=g.source_code, module=g.module or None, stable_form=_RECURRENCE_FIX,
            pattern=f"the gradient grows ×{g.rate:.3g} per call of `{g.module or g.cls}` going back "
                    f"through its recurrence (×{g.total:.3g} over the {g.calls} calls of a step)")

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.in_optimizer:
            return out
        # a list argument's tensors too: ``stack`` / ``cat`` of a data-only feature with others
        tensors = [t for a in args for t in ((a,) if isinstance(a, torch.Tensor) else
                                             a if isinstance(a, (list, tuple)) else ())
                   if isinstance(t, torch.Tensor)]
        op = canonical_op(str(func))
        prods = tuple(self.prod.get(t) for t in tensors[:2])
        self.rows.made(func, op, args, kwargs, out)
        self._made(op, args, prods, out)  # also under no_grad: gaussian_nll_loss clamps var there
        region = _fn_regions.current()
        if not torch.is_grad_enabled() and region is None:
            self._no_grad(func, args, kwargs, tensors, prods, op, out)
            return out
        self._region = region
        if region is not None or any(t.requires_grad for t in tensors):
            # inside a custom Function's own code everything makes its output or its gradient
            for t in tensors:
                if t.is_leaf and t.requires_grad:  # a weight: ``p.data -= ...`` writes its storage
                    ptr = _storage_ptr(t)
                    if ptr is not None:
                        self.weights.add(ptr)
            self._commit(tensors)
            self._held = None
        else:  # data only (a mask, a per-sample standardisation): held until it meets the graph
            self._held = [p for t in tensors for p in self.pending.get(t, ())][:_MAX_HELD]
        try:
            self._observe(op, args, tensors, prods, out)
        except RuntimeError:
            pass  # a tensor that cannot be reduced (meta, sparse): nothing to say
        held, self._held = self._held, None
        if held:
            for o in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(o, torch.Tensor):
                    self.pending[o] = held
        return out

    def _no_grad(self, func: Any, args: Any, kwargs: Any, tensors: list[torch.Tensor],
                 prods: tuple[Any, ...], op: str, out: Any) -> None:
        """An op under ``no_grad`` outside an optimizer's ``step()``: a metric, an evaluation —
        or a hand-written update (LARS's trust ratio ``|w| / |g|``, ``p -= lr * g / g.norm()``).
        Its unsafe ops are held on their results like data-only ones, carried through the
        ``no_grad`` ops after them (a momentum buffer updated in place), and go into the book
        when an in-place op writes one into a weight (a leaf that requires grad)."""
        if torch._C._current_graph_task_id() != -1:
            return  # autograd's own backward (grad mode is off there): not an update written by hand
        written = mutated_args(func, args, kwargs)
        if any((t.is_leaf and t.requires_grad) or _storage_ptr(t) in self.weights for t in written):
            self._commit(tensors)
            if self.on_weight_write is not None:
                self.on_weight_write()
            return
        self._held = [p for t in tensors for p in self.pending.get(t, ())]
        self._updating = True
        try:
            self._observe(op, args, tensors, prods, out)
        except RuntimeError:
            pass  # a tensor that cannot be reduced (meta, sparse): nothing to say
        finally:
            self._updating = False
        held, self._held = self._held, None
        if held:
            held = _newest(held)
            for o in [*written, *(out if isinstance(out, (tuple, list)) else (out,))]:
                if isinstance(o, torch.Tensor):
                    self.pending[o] = held

    def _commit(self, tensors: list[torch.Tensor]) -> None:
        """An op on the autograd graph reads these: what data-only ops held on them reaches
        the loss, and goes into the book."""
        for t in tensors:
            held = self.pending.pop(t, None)
            for kw in held or ():
                self.book.observe(**kw)

    def _made(self, op: str, args: Any, prods: tuple[Any, ...], out: Any) -> None:
        """Remember which op made each output (through ops that only move values; a cast,
        ``_to_copy`` or ``copy_`` — both ``copy`` here — from its source, the last tensor)."""
        if op in _PASS or op == "copy":
            src = (prods[-1] if op == "copy" else prods[0]) if prods else None
            if src is None:
                if op == "copy" and isinstance(out, torch.Tensor):
                    self.prod.pop(out, None)  # a buffer refilled from a source of no known op
                return
            made = src
        else:
            label = op + "+eps" if op in _FLOORS and _positive_scalar(args) else op
            if label == "clamp+eps" and _inside_unit(args):
                label = _CLAMP_INSIDE  # the floor of an acos: strictly inside ±1
            elif op in _COMPARE and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args[:2]):
                label = op + _ON_MODEL  # a test of the model's values (``losses > 0``), not of the data
            made = (label, tuple(_trunc(p, 3) for p in prods))  # 4 levels: exp(x - max) is seen
        for o in (out if isinstance(out, (tuple, list)) else (out,)):  # max.dim: (values, indices)
            if isinstance(o, torch.Tensor):
                self.prod[o] = made

    def _observe(self, op: str, args: Any, tensors: list[torch.Tensor], prods: tuple[Any, ...],
                 out: Any) -> None:
        x = tensors[0] if tensors else None
        if x is None or not x.is_floating_point() or x.numel() == 0:
            return
        if op in _ZERO:
            m = _min(x) + (1.0 if op == "log1p" else 0.0)
            self._add(op, "zero", m, x.dtype, _pattern(op, prods[0]) or self._moving(op, x, m),
                      _guarded(prods[0]), raw=(x, "log1p" if op == "log1p" else "min"))
        elif op == "div" and len(args) > 1 and isinstance(args[1], torch.Tensor) and args[1].numel():
            d = args[1]
            if not d.is_complex() and d.dtype != torch.bool:  # a count may be an integer tensor
                dp = prods[1] if len(prods) > 1 else None
                pat = _pattern("div", dp)
                exp_key = self.exp_keys.get(x) if pat and pat[0].startswith("a hand-written softmax") else None
                if exp_key is not None and pat is not None:  # the exp that overflows is the hazard
                    self.book.set_pattern(exp_key, pat[0], pat[1])
                    pat = None
                m = _min_abs(d)
                self._add("div", "zero", m, d.dtype, self._data_zero(d) or pat or self._moving("div", d, m),
                          _guarded(dp), raw=(d, "min_abs"))
        elif op == "pow" and len(args) > 1 and isinstance(args[1], (int, float)) and 0 != args[1] < 1:
            e = float(args[1])  # x ** 0.5 is a sqrt; x ** -1 a division
            self._add("sqrt" if e > 0 else "pow", "zero", _min(x) if e > 0 else _min_abs(x), x.dtype,
                      _pattern("pow", prods[0], e))
        elif op in _UNIT:
            m = 1.0 - _max_abs(x)  # the distance to the edge of the domain
            # clamped strictly inside ±1 (``clamp(-1, 1)`` is not: acos' gradient is infinite at 1)
            inside = prods[0] is not None and prods[0][0] == _CLAMP_INSIDE and m > 0
            self._add(op, "edge", m, x.dtype, None if inside else _UNIT_PATTERN, inside)
        elif op in ("exp", "expm1"):
            left = math.log(MAX.get(_name(x.dtype), MAX["float32"])) - _max(x)
            half = x.dtype == torch.float16 and not _ops(prods[0]) & {"amax", "max"}
            key = self._add(op, "overflow", left, x.dtype, _HALF_EXP if half else None, raw=(x, "exp"))
            if isinstance(out, torch.Tensor) and key is not None:
                self.exp_keys[out] = key
        elif op in _SOFTMAX:
            got = self.rows.masked_softmax(x)
            if got is not None:
                self._add("softmax", "masked", got[1], x.dtype, (
                    f"softmax over scores filled with -inf where the data masks them: {got[0]} hold a "
                    "row masked at every position (a softmax of -inf only is 0/0)",
                    "scores.masked_fill(mask, torch.finfo(scores.dtype).min)  # or drop the empty rows", None))
        if isinstance(out, torch.Tensor) and out.dtype in _LOW and out.numel():
            big = float(out.detach().abs().max())
            if math.isfinite(big) and big > 0:
                room = MAX[_LOW[out.dtype]] / big
                if room < _LIST_HEADROOM:
                    self._add(_LOW[out.dtype], "headroom", room, out.dtype, None)

    def _data_zero(self, d: torch.Tensor) -> Pattern | None:
        """A divisor taken from the data, or summed from it, that rows of its source make 0."""
        said = self.rows.zero_divisor(d)
        if said is None:
            return None
        return (f"division by data that is 0 on some rows: {said}",
                "x / d.clamp_min(1e-8)  # or drop those rows; a masked mean: .clamp_min(1) on the count", None)

    def _moving(self, op: str, x: torch.Tensor, margin: float) -> Pattern | None:
        """A parameter read as it is (no softplus, no clamp) that gradient steps take toward the
        singularity at 0: its smallest value shrank since it was first seen, at a rate that
        reaches 0 within :data:`_PARAM_AHEAD` steps."""
        if not self.moving or not isinstance(x, torch.nn.Parameter):
            return None
        if x not in self.params:
            self.params[x] = (self.book.now, margin)
        first_step, first = self.params[x]
        n = self.book.now - first_step
        if n <= 0 or not 0 < margin < first:
            return None
        ahead = math.ceil(margin / ((first - margin) / n))
        if ahead > _PARAM_AHEAD:
            return None
        return (f"{op} of a raw parameter that gradient steps take toward 0: its smallest value "
                f"went {first:.3g} → {margin:.3g} in {n} step{'s' if n != 1 else ''}, 0 in ~{ahead} more",
                "torch.exp(log_v)  # or F.softplus(raw) + 1e-6: positive by construction", None)

    def _add(self, op: str, kind: str, margin: float, dtype: torch.dtype,
             pattern: Pattern | None, guarded: bool = False,
             raw: tuple[torch.Tensor, str] | None = None) -> Any:
        """Hand one observation to the book; its key there (``None``: nothing recorded).
        ``raw``: the op's input and how its margin is read (:func:`raw_margins`) — kept in
        :attr:`raw` when it is a parameter read as it is, so the watch can follow that margin
        between its looks."""
        if not math.isfinite(margin) and kind != "overflow":
            return None  # it already fired (a NaN/Inf input): what nanguard run is for
        if self._held is not None and margin <= 0 and kind in ("zero", "edge"):
            return None  # data already at the singularity, and the run went on: a mask (log of a tril)
        loc = user_frame(2)
        path, _typ = self.modules.current()
        region = self._region
        if region is not None:  # a custom autograd Function's own forward or backward
            if region[0] == "forward":
                self.fn_modules[region[1]] = path or ""
            else:
                path = path or self.fn_modules.get(region[1])
        kw: dict[str, Any] = {
            "op": op, "kind": kind, "margin": margin, "step": self.book.now, "dtype": _name(dtype),
            "source": loc.short if loc else None, "source_code": loc.code if loc else None,
            "module": path or None, "pattern": pattern[0] if pattern else None,
            "stable_form": pattern[1] if pattern else None, "guarded": guarded,
            "pattern_edge": pattern[2] if pattern else None}
        if self._held is not None:  # data only (until it meets the graph), or not yet in an update
            self._held.append({**kw, "data_only": not self._updating})
            return None
        key = self.book.observe(**kw)
        if raw is not None and type(raw[0]) is torch.nn.Parameter and not guarded:  # not a DTensor's shard
            self.raw.setdefault(raw[0], {})[key] = (raw[1], kw)
        return key


def raw_margins(reads: list[tuple[torch.Tensor, str]]) -> list[float]:
    """The margins of parameters read as they are, one host read for all: ``min`` (the smallest
    value under a ``log``/``sqrt``), ``log1p`` (that + 1), ``min_abs`` (a divisor), ``exp`` (the
    e-folds left below the dtype's overflow). Called between steps, outside any mode."""
    with torch.no_grad():
        parts = []
        for t, how in reads:
            v = t.detach()
            parts.append((v.abs().min() if how == "min_abs" else v.max() if how == "exp" else v.min()).float())
        devices = {v.device for v in parts}
        vals = torch.stack(parts).tolist() if len(devices) == 1 else [float(v) for v in parts]
    out = []
    for (t, how), v in zip(reads, vals):
        if how == "exp":
            v = math.log(MAX.get(_name(t.dtype), MAX["float32"])) - v
        elif how == "log1p":
            v += 1.0
        out.append(v)
    return out


def _min(x: torch.Tensor) -> float:
    return float(x.detach().min())


def _min_abs(x: torch.Tensor) -> float:
    return float(x.detach().abs().min())


def _max_abs(x: torch.Tensor) -> float:
    return float(x.detach().abs().max())


def _max(x: torch.Tensor) -> float:
    return float(x.detach().max())


class HazardCheck:
    """What :func:`check` yields: the book filling in, and the ranked hazards at the end."""

    def __init__(self, steps: int | None) -> None:
        self.book = HazardBook()
        self.limit = steps

    @property
    def steps(self) -> int:
        return self.book.steps

    @property
    def hazards(self) -> list[Any]:
        """The hazards, assessed and ranked (risky first); read after the ``with`` block."""
        return self.book.ranked()


@contextlib.contextmanager
def check(steps: int | None = None) -> Iterator[HazardCheck]:
    """Watch every unsafe op on the path to the loss; stop after ``steps`` optimizer steps (in a
    script that updates its weights by hand: after ``steps`` backward passes each followed by a
    write into a weight, when the next backward begins — :class:`_HandSteps`).

    Runs around the training loop::

        with nanguard.check(steps=50) as hz:
            train()                       # stopped after the 50th optimizer.step()
        for h in hz.hazards: print(h.risk, h.op, h.source, h.reasons)

    When the last step is done, the ``optimizer.step()`` that ended it raises
    :class:`CheckDone` out of the loop; the ``with`` block takes it back.
    """
    hz = HazardCheck(steps)
    stack = ModuleStack()
    mode = HazardMode(hz.book, stack)

    hand = _HandSteps(hz, mode)
    mode.on_weight_write = hand.updated

    def pre(opt: Any, a: Any, k: Any) -> None:
        mode.in_optimizer += 1
        hand.on = False  # an optimizer counts the steps from now on

    def post(opt: Any, a: Any, k: Any) -> None:
        mode.step_done()  # the step's ops pass through the mode until in_optimizer drops
        mode.in_optimizer -= 1
        hz.book.steps += 1
        if hz.limit is not None and hz.book.steps >= hz.limit:
            raise CheckDone(f"the {hz.book.steps} steps checked are done")

    handle = _autograd.add_optimizer_listener(pre, post)
    by_hand = _autograd.add_backward_listener(hand)
    stack.install()
    try:
        with mode:
            yield hz
    except CheckDone:
        pass
    finally:
        stack.remove()
        handle.remove()
        by_hand.remove()


class _HandSteps(_autograd.BackwardListener):
    """The check's steps in a script that updates its weights by hand (no ``torch.optim``
    optimizer has stepped): a step is a backward pass followed by a write into a weight under
    ``no_grad`` (told by the mode, :attr:`HazardMode.on_weight_write`); the check stops when the
    backward after the last checked step begins — that step's update has run. Gradient
    accumulation before an optimizer's first step writes no weight: no step is counted."""

    def __init__(self, hz: HazardCheck, mode: HazardMode) -> None:
        self.hz, self.mode = hz, mode
        self.on = True  # until an optimizer steps
        self.counted = 0
        self._backward_done = False

    def before(self, kind: str, roots: Any, grads: Any, inputs: Any) -> None:
        hz = self.hz
        if self.on and self.counted and hz.limit is not None and hz.limit <= hz.book.steps:
            raise CheckDone(f"the {hz.book.steps} steps checked are done")

    def after(self, kind: str, roots: Any, inputs: Any, result: Any) -> None:
        if self.on and not self.mode.in_optimizer:
            self._backward_done = True

    def updated(self) -> None:
        """A weight was written by hand: the first write after a backward ends its step."""
        if self.on and self._backward_done:
            self._backward_done = False
            self.mode.step_done()
            self.hz.book.steps += 1
            self.counted += 1
