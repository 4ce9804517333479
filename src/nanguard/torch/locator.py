"""The locator: find the op that made the first non-finite value, with provenance.

A :class:`torch.utils._python_dispatch.TorchDispatchMode` sees every aten op of the forward pass,
the backward pass (PyTorch's ReluGrad is ``aten.threshold_backward``) and the optimizer step. For
each floating output it asks one question: is it finite? When it is not:

* if a non-finite input flowed into the op, the output *inherits* that input's origin;
* if all inputs were finite, this op is a new *origin* (its finding is filled in: op, phase,
  module, source line, autograd node, input statistics);
* a non-finite tensor that entered from outside (the batch, a weight) gets an origin of kind
  ``data`` or ``parameter``.

Nothing is reported when an origin is made: a ``-inf`` attention mask that a softmax turns back into
finite values is not a problem. A finding is reported when a non-finite value *reaches* something
that matters — the root of a backward pass (the loss), a gradient written to a leaf, a weight or
optimizer state written in place — and it names the origin whose values got there.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from ..core.errors import NonFiniteError
from ..core.finding import Finding
from ..core.ops import canonical_op
from ..core.source import skip_dir, user_frame
from . import _autograd
from ._modules import ModuleStack, param_names, storage_key
from ._stats import (
    all_finite,
    checkable,
    counts,
    finding_for,
    is_finite,
    iter_tensors,
    tensor_stats,
)

__all__ = ["Locator", "locate"]

skip_dir(torch.__path__[0])

_META_KEY = "nanguard"
_SEQ = itertools.count()
_aten = torch.ops.aten


_WINDOW = 64


@dataclass
class _Deferred:
    """One op whose finiteness flags are still on the device."""

    func: Any
    info: Any
    args: Any
    kwargs: dict[str, Any]
    outs: list[torch.Tensor]
    mutated: list[torch.Tensor]
    pre: torch.Tensor | None
    pre_stats: dict[int, Any]
    flags: torch.Tensor
    phase: str
    node: Any
    where: Any


@dataclass
class Origin:
    """Where a family of non-finite values came from (one per origin op / bad input)."""

    finding: Finding
    seq: int = field(default_factory=lambda: next(_SEQ))
    deliberate: bool = False  # made from an explicit inf/nan constant (masks)


# ops that cannot turn finite inputs into NaN/Inf: their outputs need no check unless an input
# is already tracked (``_to_copy``/``copy_`` are not here: a cast to float16 can overflow)
_SAFE = frozenset({
    "view", "_unsafe_view", "reshape", "expand", "t", "transpose", "permute", "unsqueeze",
    "squeeze", "select", "slice", "alias", "detach", "as_strided", "contiguous", "clone",
    "split", "split_with_sizes", "chunk", "unbind", "narrow", "cat", "stack", "index_select",
    "gather", "embedding", "relu", "relu_", "threshold", "threshold_backward", "hardtanh",
    "clamp", "clamp_min", "clamp_max", "sigmoid", "tanh", "_softmax", "_log_softmax", "abs",
    "neg", "where", "max_pool2d_with_indices", "max_pool1d", "max_pool3d_with_indices",
    "adaptive_max_pool2d", "max_pool2d_with_indices_backward", "native_dropout",
    "native_dropout_backward", "zeros_like", "ones_like", "zeros", "ones", "empty",
    "empty_like", "empty_strided", "new_empty", "new_zeros", "new_ones", "new_empty_strided",
    "zero_", "fill_", "full", "full_like", "arange", "masked_fill", "masked_fill_",
    "max", "min", "amax", "amin", "fill", "lift_fresh", "_unsafe_index", "index", "flip", "roll",
})
# ops whose output explains a later log/div/sqrt (softmax underflow, sigmoid saturation, ...)
_EXPLAINS = frozenset({"softmax", "log_softmax", "sigmoid", "std", "var", "sqrt", "exp", "tanh",
                       "var_mean", "std_mean", "norm", "mean", "sum"})
# in-place ops whose overwritten argument is the one with the singularity (log_, sqrt_, ...)
_UNARY_SINGULAR = frozenset({"log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "exp",
                             "exp2", "expm1", "pow", "acos", "asin", "atanh", "div"})
# ops that select part of a tensor: the batch is what comes out of ``data[i]``, not ``data``
_SELECT = frozenset({"select", "slice", "index", "index_select", "narrow", "_unsafe_index",
                     "take", "masked_select", "gather"})
# ops that only move a value: a literal passing through them stays a literal
_PASS_THROUGH = frozenset({"lift_fresh", "detach", "alias", "clone", "_to_copy", "view", "_unsafe_view",
                           "expand", "unsqueeze", "squeeze", "reshape"})


@dataclass
class _SchemaInfo:
    names: list[str]
    mutated: list[int]  # positions of arguments written in place
    mutated_kw: list[str]
    inplace: bool
    canonical: str
    packet: str
    name: str
    safe: bool  # cannot make a non-finite value from finite inputs
    explains: bool  # its output explains a later singularity (softmax before a log)


_SCHEMA_CACHE: dict[Any, _SchemaInfo] = {}


def _schema(func: Any) -> _SchemaInfo:
    info = _SCHEMA_CACHE.get(func)
    if info is None:
        args = func._schema.arguments
        mutated = [i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write]
        info = _SchemaInfo(
            names=[a.name for a in args],
            mutated=[i for i in mutated if not args[i].kwarg_only],
            mutated_kw=[args[i].name for i in mutated if args[i].kwarg_only],
            inplace=bool(mutated),
            canonical=canonical_op(str(func)),
            packet=str(func).split(".")[1] if str(func).count(".") >= 2 else str(func),
            name=str(func),
            safe=(str(func).split(".")[1] if str(func).count(".") >= 2 else "") in _SAFE,
            explains=canonical_op(str(func)) in _EXPLAINS,
        )
        _SCHEMA_CACHE[func] = info
    return info


def _clone_tree(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone_tree(v) for v in obj)
    return obj


def _flat(obj: Any) -> list[torch.Tensor]:
    """Tensors in op arguments/outputs: a tensor, or a (nested) list/tuple/dict of them."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    out: list[torch.Tensor] = []
    if isinstance(obj, (list, tuple)):
        for o in obj:
            if isinstance(o, torch.Tensor):
                out.append(o)
            elif isinstance(o, (list, tuple, dict)):
                out.extend(_flat(o))
    elif isinstance(obj, dict):
        for o in obj.values():
            out.extend(_flat(o))
    return out


def _nonfinite_scalar(args: Any) -> bool:
    return any(isinstance(a, float) and not math.isfinite(a) for a in args)


class _IdMap:
    """``tensor -> value`` keyed by identity with weak references: an int dict lookup per query
    (``torch.utils.weak.WeakIdKeyDictionary`` allocates a reference object per lookup)."""

    def __init__(self) -> None:
        self._d: dict[int, tuple[weakref.ref[torch.Tensor], Any]] = {}

    def __bool__(self) -> bool:
        return bool(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, t: object) -> bool:
        e = self._d.get(id(t))
        return e is not None and e[0]() is t

    def get(self, t: object, default: Any = None) -> Any:
        e = self._d.get(id(t))
        if e is None or e[0]() is not t:
            return default
        return e[1]

    def __setitem__(self, t: torch.Tensor, value: Any) -> None:
        key = id(t)
        d = self._d

        def drop(_ref: object, k: int = key) -> None:
            d.pop(k, None)

        d[key] = (weakref.ref(t, drop), value)

    def pop(self, t: object, default: Any = None) -> Any:
        if t in self:
            return self._d.pop(id(t))[1]
        return default

    def items(self) -> list[tuple[torch.Tensor, Any]]:
        out = []
        for ref, v in list(self._d.values()):
            t = ref()
            if t is not None:
                out.append((t, v))
        return out


def _fmt_dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


class Locator(TorchDispatchMode):
    """The dispatch mode behind :func:`locate`, the replay and ``--trace``.

    Runs on every op while active (forward, backward, optimizer). ``on_sink`` decides what happens
    when a non-finite value reaches the loss, a gradient or a weight: ``"raise"`` raises
    :class:`NonFiniteError` at once, ``"record"`` appends to :attr:`findings` and goes on.
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        *,
        modules: ModuleStack | None = None,
        on_sink: str = "raise",
        step: int | None = None,
        detected_by: str = "trace",
    ) -> None:
        super().__init__()
        self.model = model
        self.modules = modules if modules is not None else ModuleStack(model)
        self.on_sink = on_sink
        self.step = step
        self.detected_by = detected_by
        self.findings: list[Finding] = []
        self.recs = _IdMap()  # non-finite tensor -> Origin
        self.from_weights = _IdMap()  # unchecked output of a gather/embedding/cat -> weight name
        self.producers = _IdMap()  # tensor -> (op, parent op, ...), for explaining ops only
        self._pending: list[tuple[list[torch.Tensor], tuple[Any, ...]]] = []
        self._params: dict[int, str] = {}
        self._params_for: set[int] | None = None
        self.in_optimizer = 0
        # deferred checks (flags on the device, one sync per window): always for CUDA tensors;
        # NANGUARD_DEFERRED=1 forces them on the CPU too (tests of the GPU path)
        self.force_deferred = os.environ.get("NANGUARD_DEFERRED", "") == "1"
        self._window: list[_Deferred] = []
        self._deferred_where: Any = None
        self.fast_optimizer = True
        self._opt_fast: tuple[Any, list[torch.Tensor], dict[Any, dict[str, Any]]] | None = None
        self.post_backward = False
        self._grad_ptrs: set[int] = set()
        self.relu_grad_note: str | None = None
        self.relu_grad_where: str | None = None
        # set by the replay: the recorded line of a tape op / of the call that fed the model
        self.source_override: Any = None
        self.call_source: Any = None
        self.frame_stop: frozenset[Any] = frozenset()
        # set by the replay: does this tensor hold (a view of) a parameter's gradient?
        self.is_grad: Any = None
        self.notes: set[str] = set()

    # --- naming of weights ----------------------------------------------------------------------
    def refresh_params(self) -> None:
        roots: list[nn.Module] = []
        if self.model is not None:
            roots.append(self.model)
        roots.extend(self.modules.roots_seen)
        key = {id(r) for r in roots}
        if key == self._params_for:
            return
        self._params_for = key
        self._params = {}
        for r in roots:
            for ptr, n in param_names(r).items():
                self._params.setdefault(ptr, n)

    def param_name(self, t: torch.Tensor) -> str | None:
        if not checkable(t):
            return None
        self.refresh_params()
        name = self._params.get(storage_key(t))
        if name is None and self.from_weights:
            name = self.from_weights.get(t)  # copied out of a weight by a gather/embedding/cat
        return name

    # --- phase and location ----------------------------------------------------------------------
    def _phase(self, args: Any = ()) -> tuple[str, Any]:
        node = torch._C._current_autograd_node()
        if node is not None:
            return "backward", node
        if self.modules.depth:
            return "forward", None
        if self.in_optimizer:
            return "optimizer", None
        if self.post_backward and self._touches_weights(args):
            # after backward(): clipping, a hand-written update — ops on weights or gradients
            return "optimizer", None
        return "forward", None

    def _touches_weights(self, args: Any) -> bool:
        for t in iter_tensors(args):
            if not checkable(t):
                continue
            if self.param_name(t) is not None or (self.is_grad is not None and self.is_grad(t)):
                return True
            if self._grad_ptrs and t.data_ptr() in self._grad_ptrs:
                return True
        return False

    def note_grads(self, leaves: Sequence[torch.Tensor]) -> None:
        """After a backward pass: remember where the gradients live (for the phase of later ops)."""
        self._grad_ptrs = {
            leaf.grad.data_ptr() for leaf in leaves if leaf.grad is not None and checkable(leaf.grad)
        }

    def _location(self, phase: str, node: Any) -> tuple[str | None, str | None, str | None, str | None]:
        """(module path, module type, source "file:line", code line)."""
        if phase == "backward":
            meta = node.metadata.get(_META_KEY) if node is not None else None
            path, typ, loc = meta if meta is not None else (None, None, None)
            if custom_function(node) is not None:
                # a hand-written ``backward`` is user code: the line running now is the one to fix
                loc = self._where()[2] or loc  # as captured when the op ran (deferred checks)
            return path, typ, (loc.short if loc else None), (loc.code if loc else None)
        path, typ, loc = self._where()
        return path, typ, (loc.short if loc else None), (loc.code if loc else None)

    def _where(self) -> tuple[str | None, str | None, Any]:
        """(module path, module type, SourceLocation) of the op running now — cheap: the text
        of the source line is only read when a finding needs it."""
        if self._deferred_where is not None:
            return self._deferred_where
        path, typ = self.modules.current()
        loc = self.source_override
        if loc is None:
            loc = user_frame(4, self.frame_stop) or self.call_source
        return path, typ, loc

    def tag_module_output(self, mod: nn.Module, output: Any) -> None:
        """When a module's ``forward`` returns (a module hook): name the module on the autograd
        nodes of its outputs that no op tagged — a custom ``torch.autograd.Function`` runs its
        ops with grad mode off, so its node is made by ``apply``, after them."""
        if self._pending:
            self._flush_pending()
        loc = None
        for t in _flat(output):
            gf = t.grad_fn if isinstance(t, torch.Tensor) else None
            md: dict[str, Any] | None = gf.metadata if gf is not None else None  # type: ignore[assignment]
            if md is None or _META_KEY in md:
                continue
            if loc is None:
                loc = user_frame(3, self.frame_stop) or self.call_source
            md[_META_KEY] = (self.modules.path_of(mod), type(mod).__name__, loc)

    def _flush_pending(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for outs, meta in pending:
            for t in outs:
                gf = t.grad_fn
                if gf is not None:
                    md: dict[str, Any] = gf.metadata  # type: ignore[assignment]
                    if _META_KEY not in md:
                        md[_META_KEY] = meta
                    break

    # --- the mode ----------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self._pending:
            self._flush_pending()
        info = _schema(func)
        recs = self.recs
        flat_args = _flat(args)
        tracked = bool(recs) and any(t in recs for t in flat_args)
        defer = self.force_deferred or any(t.is_cuda for t in flat_args)
        pre_flags: torch.Tensor | None = None

        # in-place ops overwrite their input: look at it before the op runs
        pre_bad: dict[int, bool] = {}
        pre_stats: dict[int, Any] = {}
        mutated: list[torch.Tensor] = []
        if info.inplace:
            for i in info.mutated:
                if i < len(args):
                    mutated.extend(t for t in _flat(args[i]) if checkable(t))
            for k in info.mutated_kw:
                if k in kwargs:
                    mutated.extend(t for t in _flat(kwargs[k]) if checkable(t))
            if not info.safe and defer and mutated:
                pre_flags = torch.stack([torch.isfinite(t).all() for t in mutated])
            if not info.safe:
                for t in mutated:
                    if t not in recs:
                        if not defer:
                            pre_bad[id(t)] = not is_finite(t)
                        if info.canonical in _UNARY_SINGULAR and t.numel() <= 1 << 22:
                            # what the op overwrites is what explains it (log_ of zeros): keep a
                            # copy; statistics are computed only if the result is not finite
                            pre_stats[id(t)] = t.detach().clone()

        try:
            out = func(*args, **kwargs)
        except Exception as exc:
            self._on_failed_op(func, args, kwargs, exc)
            raise

        requires_grad = torch.is_grad_enabled() and any(
            getattr(a, "requires_grad", False) for a in _flat(args)
        )
        if self.post_backward and requires_grad and self.modules.depth == 0:
            self.post_backward = False  # a module-less forward pass started again

        outs = [t for t in _flat(out) if checkable(t)]
        if mutated:
            seen = {id(t) for t in outs}
            outs.extend(t for t in mutated if id(t) not in seen)
        if not outs:
            return out

        node = torch._C._current_autograd_node()
        # forward ops that build autograd nodes: tag the node with module and source for backward
        if node is None and requires_grad:
            self._pending.append((outs, self._where()))

        # remember who made what explains a later singularity ("the input of log came from
        # softmax"): only for the few ops that matter, and one step downstream of them
        if info.explains:
            for t in outs:
                self.producers[t] = (info.name,)
        elif self.producers:
            for a in _flat(args):
                parent = self.producers.get(a)
                if parent is not None and len(parent) == 1:
                    for t in outs:
                        self.producers[t] = (info.name, parent[0])
                    break

        if info.safe and not tracked and not defer and not kwargs and not _nonfinite_scalar(args):
            # cannot make a non-finite value from finite inputs (views, relu, softmax, ...);
            # a non-finite input from outside is classified where it is first used for arithmetic
            # — so remember which weight an embedding lookup, a gather or a cat copied from
            self.refresh_params()
            if self._params:
                for a in flat_args:
                    if not checkable(a):
                        continue
                    wname = self._params.get(storage_key(a))
                    if wname is None and self.from_weights:
                        wname = self.from_weights.get(a)
                    if wname is not None:
                        for t in outs:
                            self.from_weights[t] = wname
                        break
            return out

        if defer:
            # no host synchronisation per op: the flags stay on the device until a sink (the
            # loss, the gradients, an optimizer step) or 64 ops later, then one sync for all
            phase, node = self._phase(args)
            self._window.append(_Deferred(
                func, info, args, kwargs, outs, mutated, pre_flags, pre_stats,
                torch.stack([torch.isfinite(t).all() for t in outs]), phase, node,
                # the place: of the op itself, or (a hand-written backward) of the line running
                self._where() if node is None or custom_function(node) is not None else None,
            ))
            if len(self._window) >= _WINDOW:
                self.flush()
            return out

        bad = [t for t in outs if not is_finite(t)]
        if not bad:
            # an in-place op may have cleaned a tracked tensor (nan_to_num_, masked_fill_)
            if recs:
                for t in mutated:
                    recs.pop(t, None)
            return out
        phase, node = self._phase(args)
        self._on_nonfinite(func, info, args, kwargs, bad, mutated, pre_bad, pre_stats, phase, node, info.name)
        return out

    def flush(self) -> None:
        """Read the device-side flags of the deferred ops (one sync) and process the bad ones
        in order, exactly as if they had been checked one by one."""
        window, self._window = self._window, []
        if not window:
            return
        flags = torch.cat([e.flags.reshape(-1) for e in window]).tolist()
        pres = [e.pre.tolist() if e.pre is not None else None for e in window if e.pre is not None]
        k = 0
        pi = 0
        for e in window:
            ok = flags[k : k + len(e.outs)]
            k += len(e.outs)
            pre_ok = None
            if e.pre is not None:
                pre_ok = pres[pi]
                pi += 1
            bad = [t for t, good in zip(e.outs, ok) if not good]
            if not bad:
                for t in e.mutated:
                    self.recs.pop(t, None)
                continue
            pre_bad = {}
            if pre_ok is not None:
                pre_bad = {id(t): not good for t, good in zip(e.mutated, pre_ok)}
            self._deferred_where = e.where
            try:
                self._on_nonfinite(e.func, e.info, e.args, e.kwargs, bad, e.mutated, pre_bad,
                                   e.pre_stats, e.phase, e.node, e.info.name)
            finally:
                self._deferred_where = None

    # --- the optimizer step ---------------------------------------------------------------------
    def optimizer_pre(self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Global optimizer pre-step hook while tracing.

        Fast path: an optimizer step is dozens of small in-place ops per weight; instead of
        checking each, the step runs untraced on a copy-protected state and one fused check
        follows it (:meth:`optimizer_post`). Only when that check fails is the step undone and
        run again op by op, to name the op that made the weights non-finite.
        """
        self.flush()
        self.in_optimizer += 1
        # torch passes the bound call's positional args, the optimizer itself first
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if closure is not None:
            def wrapped() -> Any:
                self.in_optimizer -= 1
                try:
                    return closure()
                finally:
                    self.in_optimizer += 1

            if "closure" in kwargs:
                return args, {**kwargs, "closure": wrapped}
            return (args[0], wrapped, *args[2:]), kwargs
        if (
            self.fast_optimizer
            and self.in_optimizer == 1
            and self._opt_fast is None
            and _get_current_dispatch_mode() is self
        ):
            self.__exit__(None, None, None)  # first: the copies below need no tracing
            params = [p for g in opt.param_groups for p in g["params"]]
            with torch.no_grad():
                saved = {
                    p: {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in opt.state[p].items()}
                    for p in params
                    if p in opt.state
                }
                self._opt_fast = (opt, [p.clone() for p in params], saved)
        return None

    def optimizer_post(self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Global optimizer post-step hook while tracing (see :meth:`optimizer_pre`)."""
        self.in_optimizer = max(0, self.in_optimizer - 1)
        self.post_backward = False
        fast = self._opt_fast
        if fast is None or fast[0] is not opt:
            self.flush()
            return
        self._opt_fast = None
        params = [p for g in opt.param_groups for p in g["params"]]
        state = [v for p in params for v in opt.state.get(p, {}).values()
                 if isinstance(v, torch.Tensor) and checkable(v)]
        ok = all_finite([*params, *state])
        if not ok:
            # undo the step: weights and optimizer state as they were before it
            _saved, clones, saved = fast
            with torch.no_grad():
                for p, c in zip(params, clones):
                    p.copy_(c)
                for p in params:
                    if p not in saved:
                        opt.state.pop(p, None)  # made by this step
                        continue
                    st = opt.state[p]
                    for k, v in saved[p].items():
                        cur = st.get(k)
                        if isinstance(v, torch.Tensor) and isinstance(cur, torch.Tensor) and cur.shape == v.shape:
                            cur.copy_(v)
                        else:
                            st[k] = v
        self.__enter__()
        if ok:
            return
        # ... and run it again, op by op, under this locator
        raw = getattr(type(opt).step, "__wrapped__", None)
        self.in_optimizer += 1
        try:
            if raw is not None:
                raw(opt)  # without the hooks: nothing else sees this second run
        finally:
            self.in_optimizer = max(0, self.in_optimizer - 1)

    # --- provenance ------------------------------------------------------------------------------
    def _on_nonfinite(
        self,
        func: Any,
        info: _SchemaInfo,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        bad: list[torch.Tensor],
        mutated: list[torch.Tensor],
        pre_bad: dict[int, bool],
        pre_stats: dict[int, Any],
        phase: str,
        node: Any,
        name: str,
    ) -> None:
        inherited: Origin | None = None
        mut_ids = {id(t) for t in mutated}
        inputs = [t for t in iter_tensors(list(args) + list(kwargs.values())) if checkable(t)]
        for t in inputs:
            o = self.recs.get(t)
            if o is not None and (inherited is None or o.seq < inherited.seq):
                inherited = o
        constant: float | None = None
        if inherited is None:
            # an input that came in non-finite from outside the locator: the batch, a weight, or
            # a literal such as torch.tensor(float("nan"))
            for t in inputs:
                was_bad = pre_bad.get(id(t)) if id(t) in mut_ids else (not is_finite(t))
                if not was_bad:
                    continue
                if t.numel() == 1 and self.param_name(t) is None and not isinstance(t, nn.Parameter):
                    constant = float(t.detach().reshape(()).item())
                    continue
                inherited = self._external_origin(t, phase)
                break
        if inherited is None and constant is not None and info.packet in _PASS_THROUGH:
            return  # lift_fresh/clone of a literal: the op that uses it is the origin
        if (
            inherited is not None
            and inherited.deliberate
            and any(bool(torch.isnan(t).any()) for t in bad)
            and not any(bool(torch.isnan(t).any()) for t in inputs if t in self.recs)
        ):
            # an intended -inf (a mask) is fine until an op turns it into NaN — softmax over a row
            # that is masked entirely: that op made the value that does harm
            mask = inherited
            inherited = self._new_origin(func, info, args, kwargs, bad[0], pre_stats, phase, node, name)
            inherited.finding.details["from_masked_inf"] = {
                "op": mask.finding.op, "source": mask.finding.source, "module": mask.finding.module,
            }
        if inherited is None:
            inherited = self._new_origin(func, info, args, kwargs, bad[0], pre_stats, phase, node, name)
            if constant is not None:
                inherited.deliberate = True
                inherited.finding.details["constant"] = str(constant)
        for t in bad:
            self.recs[t] = inherited
        f = inherited.finding
        if f.phase == "data" and not f.details.get("batch_final"):
            if info.packet in _SELECT or info.packet in _PASS_THROUGH:
                # the batch is still being taken out of a larger tensor: describe what came out
                b = bad[0]
                f.nan, f.posinf, f.neginf = counts(b)
                f.dtype, f.shape = _fmt_dtype(b), tuple(b.shape)
                f.details["samples"] = bad_samples(b)
            else:
                f.details["batch_final"] = True
        if info.canonical in ("relu", "threshold") and phase == "forward" and inherited.seq != -1:
            # early TensorFlow checked the forward input of every ReLU when building its gradient:
            # the last ReLU a non-finite value passes through is where "ReluGrad input is not
            # finite" fired, first thing in the backward pass
            path, typ, src, _code = self._location(phase, node)
            where = f"`{path}` ({typ})" if path else (f"the {typ}" if typ else "a relu")
            self.relu_grad_where = where
            self.relu_grad_note = (
                f"TensorFlow's old `ReluGrad input is not finite` would have fired at {where}"
                + (f", {src}" if src else "") + ", in the backward pass"
            )

        # sinks: a weight, a gradient or optimizer state written in place
        if mutated and phase != "backward":
            hit = [t for t in bad if id(t) in mut_ids]
            pnames = [n for n in (self.param_name(t) for t in hit) if n]
            if pnames:
                self._reached(inherited, "parameters", parameters=pnames, op_now=name)
            elif hit and self.is_grad is not None and any(self.is_grad(t) for t in hit):
                gnames = [n for n in (self.is_grad(t) for t in hit) if n]
                self._reached(inherited, "gradients", gradients=gnames, op_now=name)
            elif hit and self.in_optimizer:
                self._reached(inherited, "optimizer state", op_now=name)

    def _on_failed_op(self, func: Any, args: Any, kwargs: dict[str, Any], exc: Exception) -> None:
        """An op raised (``multinomial`` on NaN probabilities, ...): was a non-finite input why?"""
        if isinstance(exc, NonFiniteError):
            return
        inputs = [t for t in iter_tensors(list(args) + list(kwargs.values())) if checkable(t)]
        origin: Origin | None = None
        for t in inputs:
            o = self.recs.get(t)
            if o is not None and (origin is None or o.seq < origin.seq):
                origin = o
        if origin is None:
            phase, _node = self._phase()
            for t in inputs:
                if not is_finite(t):
                    origin = self._external_origin(t, phase)
                    break
        if origin is not None:
            self._reached(
                origin, f"input of `{func}`, which then raised {type(exc).__name__}", error=str(exc)[:300]
            )

    def _external_origin(self, t: torch.Tensor, phase: str) -> Origin:
        pname = self.param_name(t) if not isinstance(t, nn.Parameter) else (self.param_name(t) or "parameter")
        if pname is not None or isinstance(t, nn.Parameter):
            mod = pname.rsplit(".", 1)[0] if pname and "." in pname else ("" if pname else None)
            f = finding_for(
                t,
                phase if phase != "data" else "forward",
                "parameter",
                module=mod,
                step=self.step,
                detected_by=self.detected_by,
                details={"origin": "parameter", "parameters": [pname] if pname else []},
            )
            return Origin(f)
        path, typ = self.modules.current()
        loc = self.source_override or self.call_source or user_frame(4, self.frame_stop)
        details: dict[str, Any] = {"origin": "data", "samples": bad_samples(t)}
        if path is not None:
            details["entered"] = f"{path} ({typ})" if path else f"{typ} (top-level module)"
        f = finding_for(
            t,
            "data",
            "input",
            module=None,  # the batch was not made by a module; where it entered is in details
            source=loc.short if loc else None,
            source_code=loc.code if loc else None,
            step=self.step,
            detected_by=self.detected_by,
            details=details,
        )
        return Origin(f, deliberate=t.numel() <= 1)

    def _new_origin(
        self,
        func: Any,
        info: _SchemaInfo,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        out: torch.Tensor,
        pre_stats: dict[int, Any],
        phase: str,
        node: Any,
        name: str,
    ) -> Origin:
        module, mtype, source, code = self._location(phase, node)
        stats = []
        scalars: dict[str, Any] = {}
        deliberate = False
        producers: list[str] = []
        vals = list(args) + [kwargs[k] for k in kwargs]
        names = info.names[: len(args)] + list(kwargs)
        for argname, v in zip(names, vals):
            if isinstance(v, torch.Tensor):
                if id(v) in pre_stats:
                    stats.append(tensor_stats(pre_stats[id(v)], f"{argname} (before the op)"))
                elif info.inplace and argname == info.names[0]:
                    pass  # overwritten by the op: what it held before is not known
                elif checkable(v) and len(stats) < 6:
                    stats.append(tensor_stats(v, argname))
                producers.extend(self.producers.get(v, ()))
            elif isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
                for j, t in enumerate(v[:3]):
                    if checkable(t):
                        stats.append(tensor_stats(t, f"{argname}[{j}]"))
            elif isinstance(v, bool) or v is None:
                continue
            elif isinstance(v, (int, float)):
                scalars[argname] = v
                if isinstance(v, float) and not math.isfinite(v):
                    deliberate = True
        grad_fn = node.name() if node is not None else None
        details: dict[str, Any] = {}
        fn_name = custom_function(node) if phase == "backward" else None
        if fn_name is not None:
            details["custom_function"] = fn_name  # the op ran in its hand-written backward
        if deliberate:
            # made from an explicit inf/nan argument (masked_fill(mask, -inf), full(..., nan))
            details["constant"] = next(
                str(v) for v in scalars.values() if isinstance(v, float) and not math.isfinite(v)
            )
        if producers:
            details["input_producers"] = producers[:4]
        pnames: list[str] = []
        if phase == "optimizer":
            for t in iter_tensors(args[:1]):
                n = self.param_name(t)
                if n:
                    pnames.append(n)
            if pnames:
                details["parameters"] = pnames
                if module is None:
                    module = pnames[0].rsplit(".", 1)[0] if "." in pnames[0] else ""
        f = finding_for(
            out,
            phase,
            name,
            module=module,
            module_type=mtype,
            source=source,
            source_code=code,
            grad_fn=grad_fn.split("::")[-1] if grad_fn else None,
            step=self.step,
            detected_by=self.detected_by,
            inputs=stats,
            scalars=scalars,
            details=details,
        )
        if out.dtype in (torch.float16, torch.bfloat16) and (f.posinf or f.neginf):
            _float32_check(func, args, kwargs, f)
        return Origin(f, deliberate=deliberate)

    # --- sinks -------------------------------------------------------------------------------------
    def _reached(self, origin: Origin, what: str, **details: Any) -> None:
        f = origin.finding
        f.mark_reached(what, self.step, **details)
        if self.relu_grad_note and "relu_grad" not in f.details:
            f.details["relu_grad"] = self.relu_grad_note
            f.details["relu_grad_layer"] = self.relu_grad_where
        if any(x is f for x in self.findings):
            return
        self.findings.append(f)
        if self.on_sink == "raise":
            raise NonFiniteError(f)

    def origin_of(self, t: torch.Tensor) -> Origin | None:
        o: Origin | None = self.recs.get(t)
        return o

    def check_roots(self, roots: Sequence[torch.Tensor]) -> None:
        """Before a backward pass: is the loss (the root) already non-finite?"""
        self.flush()
        self._flush_pending()
        for r in roots:
            if isinstance(r, torch.Tensor) and checkable(r) and not is_finite(r):
                origin = self.origin_of(r)
                if origin is None:
                    origin = self._external_origin(r, "forward")
                self._reached(origin, "loss")

    def check_grads(self, leaves: Sequence[torch.Tensor], grads: Sequence[Any] | None = None) -> None:
        """After a backward pass: did a non-finite value reach a gradient?"""
        self.flush()
        items: list[tuple[torch.Tensor, torch.Tensor]] = []
        if grads is not None:
            items = [(leaf, g) for leaf, g in zip(leaves, grads) if isinstance(g, torch.Tensor)]
        else:
            items = [(leaf, leaf.grad) for leaf in leaves if leaf.grad is not None]
        bad = [(leaf, g) for leaf, g in items if checkable(g) and not is_finite(g)]
        if not bad:
            return
        best: Origin | None = None
        for _, g in bad:
            o = self.origin_of(g)
            if o is not None and (best is None or o.seq < best.seq):
                best = o
        if best is None:
            # accumulated into an already non-finite .grad, or made outside the locator
            leaf, g = bad[0]
            pname = self.param_name(leaf)
            best = Origin(
                finding_for(
                    g,
                    "backward",
                    None,
                    module=pname.rsplit(".", 1)[0] if pname and "." in pname else None,
                    step=self.step,
                    detected_by=self.detected_by,
                    details={"note": "the gradient was non-finite before this backward pass"},
                )
            )
        names = [n for n in (self.param_name(leaf) for leaf, _ in bad) if n]
        self._reached(best, "gradients", gradients=names)


def custom_function(node: Any) -> str | None:
    """The class name of a user's ``torch.autograd.Function`` whose backward ``node`` runs, or
    ``None`` for PyTorch's own nodes."""
    cls = getattr(node, "_forward_cls", None) if node is not None else None
    return getattr(cls, "__name__", None) if isinstance(cls, type) else None


def _float32_check(func: Any, args: Sequence[Any], kwargs: dict[str, Any], f: Finding) -> None:
    """Re-run a low-precision op in float32: would it have stayed finite?"""
    try:

        def up(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16):
                return x.detach().float()
            if isinstance(x, torch.dtype) and x in (torch.float16, torch.bfloat16):
                return torch.float32
            if isinstance(x, (list, tuple)):
                return type(x)(up(v) for v in x)
            return x

        info = _schema(func)
        if info.inplace:
            return
        out32 = func(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()})
        t = next(iter(iter_tensors(out32)), None)
        if t is not None and t.is_floating_point():
            fin = bool(torch.isfinite(t).all())
            f.details["float32_finite"] = fin
            if fin:
                f.details["float32_absmax"] = float(t.abs().max())
    except Exception:  # the float32 re-run is evidence, never a requirement
        return


def bad_samples(t: torch.Tensor, limit: int = 20) -> list[dict[str, Any]]:
    """Which samples (dim 0) and features of a batch hold NaN/Inf."""
    if t.dim() == 0:
        return [{"index": 0, "kind": "NaN" if torch.isnan(t).item() else "Inf"}]
    x = t.detach()
    bad = ~torch.isfinite(x)
    rows = bad.reshape(bad.shape[0], -1).any(dim=1).nonzero().flatten()[:limit].tolist()
    out = []
    for i in rows:
        row = bad[i].reshape(-1)
        feats = row.nonzero().flatten()[:8].tolist()
        vals = x[i].reshape(-1)[feats]
        kind = "NaN" if bool(torch.isnan(vals).any()) else "Inf"
        d: dict[str, Any] = {"index": int(i), "kind": kind}
        if x.dim() > 1:
            d["features"] = [int(j) for j in feats] if x.dim() == 2 else [
                tuple(int(v) for v in torch.unravel_index(torch.tensor(j), x.shape[1:])) for j in feats
            ]
        out.append(d)
    return out


# ----------------------------------------------------------------------------------------------
# the public context manager


class _LocateListener(_autograd.BackwardListener):
    def __init__(self, loc: Locator) -> None:
        self.loc = loc
        self.leaves: list[list[torch.Tensor]] = []

    def before(
        self,
        kind: str,
        roots: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor | None],
        inputs: Sequence[torch.Tensor] | None,
    ) -> None:
        self.loc.check_roots(roots)
        self.leaves.append(list(inputs) if inputs is not None else graph_leaves(roots))

    def after(
        self,
        kind: str,
        roots: Sequence[torch.Tensor],
        inputs: Sequence[torch.Tensor] | None,
        result: Any,
    ) -> None:
        leaves = self.leaves.pop() if self.leaves else []
        self.loc.post_backward = True
        self.loc.note_grads(leaves)
        if kind == "grad":
            self.loc.check_grads(leaves, list(result) if result is not None else [])
        else:
            self.loc.check_grads(leaves)


def graph_leaves(roots: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The leaf tensors (weights) a backward pass from ``roots`` will write ``.grad`` into."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    stack = [r.grad_fn for r in roots if isinstance(r, torch.Tensor) and r.grad_fn is not None]
    for r in roots:
        if isinstance(r, torch.Tensor) and r.grad_fn is None and r.requires_grad:
            out.append(r)
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        var = getattr(fn, "variable", None)
        if isinstance(var, torch.Tensor):
            out.append(var)
            continue
        for nxt, _ in fn.next_functions:
            if nxt is not None:
                stack.append(nxt)
    return out


@contextlib.contextmanager
def locate(model: nn.Module | None = None, *, step: int | None = None) -> Iterator[Locator]:
    """Raise :class:`NonFiniteError` naming the op that made the first NaN/Inf that mattered.

    Wrap any code — forward, ``loss.backward()``, ``optimizer.step()`` — in it::

        with nanguard.locate(model):
            loss = model(x).sum()
            loss.backward()

    Runs on every op inside the block (the *trace* tier: about as costly as
    ``torch.autograd.detect_anomaly``, but it checks forward, backward and the optimizer, for NaN
    and Inf). It raises when a non-finite value reaches the loss (``backward()`` is called on it),
    a gradient, or a weight — not before: a ``-inf`` mask that a softmax absorbs is no error, and
    neither is a non-finite value that is made but never used for training. The error names the
    *origin*: the op that made non-finite values from finite inputs, whose values got there.
    ``model`` (optional) names modules relative to it.
    """
    stack = ModuleStack(model)
    loc = Locator(model, modules=stack, on_sink="raise", step=step)

    def on_enter(mod: nn.Module) -> None:
        loc.post_backward = False

    stack.on_enter = on_enter
    stack.on_exit = loc.tag_module_output
    stack.install()
    bh = _autograd.add_backward_listener(_LocateListener(loc))
    oh = _autograd.add_optimizer_listener(loc.optimizer_pre, loc.optimizer_post)
    try:
        with loc:
            yield loc
            loc.flush()
    finally:
        bh.remove()
        oh.remove()
        stack.remove()
