"""The locator's private ``TorchDispatchMode``: every aten op, one finiteness question per output.

Owned by :class:`nanguard.torch.locator.Locator` (``locate()``, ``--trace``) and by the replays,
each configured by a :class:`~nanguard.torch.locator.LocateOptions`. While active it sees every op
of the forward pass, the backward pass (PyTorch's ReluGrad is ``aten.threshold_backward``) and the
optimizer step. For each floating output (and each tensor written in place) it asks whether it is
finite — one reduction, or, for CUDA tensors, a flag kept on the device and read with one sync per
64 ops. Ops that cannot make a non-finite value from finite inputs (the core table's ``safe``
ops) are not checked unless an input is already tracked. A non-finite output inherits the origin
of a non-finite input; otherwise it is a new origin (:mod:`._origins`); findings are reported at
sinks (:mod:`._sinks`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..core import config
from ..core.finding import Finding
from ._modules import ModuleStack, storage_key
from ._opinfo import OpInfo, op_info
from ._options import LocateOptions
from ._optstep import OptimizerSteps
from ._origins import bad_samples
from ._place import custom_function, flat
from ._provenance import IdMap, Origin, Provenance
from ._sinks import Sinks
from ._stats import checkable, counts, is_finite, iter_tensors
from ._untraced import Untraced

__all__ = ["LocatorMode"]

_WINDOW = 64


@dataclass
class _Deferred:
    """One op whose finiteness flags are still on the device (``flags is None``: an op with no
    floating output, kept only to mark its inputs used in order)."""

    func: Any
    info: Any
    args: Any
    kwargs: dict[str, Any]
    reads: list[torch.Tensor]
    outs: list[torch.Tensor]
    mutated: list[torch.Tensor]
    pre: torch.Tensor | None
    pre_stats: dict[int, Any]
    flags: torch.Tensor | None
    phase: str
    node: Any
    where: Any


def _nonfinite_scalar(args: Any) -> bool:
    return any(isinstance(a, float) and not math.isfinite(a) for a in args)


def _fmt_dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


class LocatorMode(Sinks):
    """The dispatch mode behind :class:`~nanguard.torch.locator.Locator` and the replays."""

    def __init__(
        self,
        model: nn.Module | None = None,
        *,
        modules: ModuleStack | None = None,
        options: LocateOptions | None = None,
        on_open: Callable[[bool], None] | None = None,
    ) -> None:
        super().__init__()
        self.opts = options if options is not None else LocateOptions()
        self.step = self.opts.step
        self.findings: list[Finding] = []
        self.prov = Provenance(on_open)
        self.producers = IdMap()  # tensor -> (op, parent op, ...), for explaining ops only
        self.fresh = IdMap()  # non-finite tensor made from Python numbers (torch.tensor) -> its line
        self.model_ran = False  # has a module's forward run under this locator (this step)?
        self.relu_grad_note: str | None = None
        self.relu_grad_where: str | None = None
        self.notes: set[str] = set()
        deferred = self.opts.deferred
        self._force_deferred = deferred if deferred is not None else config.deferred_flags()
        self._report_unused = self.opts.unused == "report"
        self._window: list[_Deferred] = []
        self._init_place(model, modules)
        self._init_sinks()
        self.optsteps = OptimizerSteps(self)

    def note(self, text: str) -> None:
        """A remark for the finding of a replay (``the model is compiled ...``)."""
        self.notes.add(text)

    # --- the mode ----------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self._busy or Untraced.depth:
            return func(*args, **kwargs)
        if self._pending:
            self._flush_pending()
        info = op_info(func)
        prov = self.prov
        flat_args = flat(args)
        self.model_ran = self.model_ran or bool(self.modules.depth)
        tracked = bool(prov) and any(t in prov for t in flat_args)
        defer = self._force_deferred or any(t.is_cuda for t in flat_args)
        if info.reads and self._report_unused:
            self._on_read(func, flat_args)  # ``.item()`` of a value made from finite inputs

        # in-place ops overwrite their input: look at it before the op runs
        mutated, pre_flags, pre_bad, pre_stats = (
            self._before_inplace(info, args, kwargs, defer) if info.inplace else ([], None, {}, {}))

        try:
            out = func(*args, **kwargs)
        except Exception as exc:
            self._on_failed_op(func, args, kwargs, exc)
            raise

        requires_grad = torch.is_grad_enabled() and any(getattr(a, "requires_grad", False) for a in flat_args)
        if self.post_backward and requires_grad and self.modules.depth == 0:
            self.post_backward = False  # a module-less forward pass started again

        outs = [t for t in flat(out) if checkable(t)] if not info.uninitialized else []
        if mutated:
            seen = {id(t) for t in outs}
            outs.extend(t for t in mutated if id(t) not in seen)
        if not outs:
            if self._report_unused and (tracked or (defer and self._window)):
                self._used(func, info, flat_args, defer)  # a comparison, an argmax: a use too
            return out

        node = torch._C._current_autograd_node()
        # forward ops that build autograd nodes: tag the node with module and source for backward
        if node is None and requires_grad:
            self._pending.append((outs, self._where()))
        self._note_producers(info, flat_args, outs)

        if info.safe and not tracked and not defer and not kwargs and not _nonfinite_scalar(args):
            # cannot make a non-finite value from finite inputs (views, relu, softmax, ...);
            # a non-finite input from outside is classified where it is first used for arithmetic
            # — so remember which weight an embedding lookup, a gather or a cat copied from
            self.note_copies(flat_args, outs)
            self._note_fresh(info, outs)
            return out

        if defer:
            # no host synchronisation per op: the flags stay on the device until a sink (the
            # loss, the gradients, an optimizer step) or 64 ops later, then one sync for all
            phase, node = self._phase(args)
            self._window.append(_Deferred(
                func, info, args, kwargs, flat_args, outs, mutated, pre_flags, pre_stats,
                torch.stack([torch.isfinite(t).all() for t in outs]), phase, node,
                # the place: of the op itself, or (a hand-written backward) of the line running
                self._where() if node is None or custom_function(node) is not None else None,
            ))
            if len(self._window) >= _WINDOW:
                self.flush()
            return out

        if tracked:
            prov.use(flat_args)
        bad = [t for t in outs if not is_finite(t)]
        if not bad:
            # an in-place op may have cleaned a tracked tensor (nan_to_num_, masked_fill_)
            for t in mutated:
                prov.clean(t)
                self._forget_write(t)
            return out
        phase, node = self._phase(args)
        self._on_nonfinite(func, info, args, kwargs, outs, bad, mutated, pre_bad, pre_stats, phase, node)
        return out

    def _before_inplace(
        self, info: OpInfo, args: Any, kwargs: dict[str, Any], defer: bool
    ) -> tuple[list[torch.Tensor], torch.Tensor | None, dict[int, bool], dict[int, Any]]:
        """What an in-place op is about to overwrite: the tensors, whether each was finite (a
        device flag when deferred), and a copy of those whose values explain a singular result."""
        mutated: list[torch.Tensor] = []
        for i in info.mutated:
            if i < len(args):
                mutated.extend(t for t in flat(args[i]) if checkable(t))
        for k in info.mutated_kw:
            if k in kwargs:
                mutated.extend(t for t in flat(kwargs[k]) if checkable(t))
        pre_flags: torch.Tensor | None = None
        pre_bad: dict[int, bool] = {}
        pre_stats: dict[int, Any] = {}
        if info.safe:
            return mutated, pre_flags, pre_bad, pre_stats
        if defer and mutated:
            pre_flags = torch.stack([torch.isfinite(t).all() for t in mutated])
        for t in mutated:
            if t not in self.prov:
                if not defer:
                    pre_bad[id(t)] = not is_finite(t)
                if info.self_explains and t.numel() <= 1 << 22:
                    # what the op overwrites is what explains it (log_ of zeros): keep a copy;
                    # statistics are computed only if the result is not finite
                    pre_stats[id(t)] = t.detach().clone()
        return mutated, pre_flags, pre_bad, pre_stats

    def _note_producers(self, info: OpInfo, flat_args: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
        """Remember who made what explains a later singularity ("the input of log came from
        softmax"): only for the few ops that matter, and one step downstream of them."""
        if info.explains:
            for t in outs:
                self.producers[t] = (info.name,)
        elif self.producers:
            for a in flat_args:
                parent = self.producers.get(a)
                if parent is not None and len(parent) == 1:
                    for t in outs:
                        self.producers[t] = (info.name, parent[0])
                    break

    def _used(self, func: Any, info: OpInfo, flat_args: list[torch.Tensor], defer: bool) -> None:
        """An op with no floating output read ``flat_args``; in order with the deferred ops."""
        if defer and self._window:
            self._window.append(_Deferred(func, info, (), {}, flat_args, [], [], None, {}, None, "", None, None))
        else:
            self.prov.use(flat_args)

    def flush(self) -> None:
        """Read the device-side flags of the deferred ops (one sync) and process them in order,
        exactly as if they had been checked one by one."""
        window, self._window = self._window, []
        if window:
            with self.own_ops():
                self._process(window)

    def _process(self, window: list[_Deferred]) -> None:
        flags = torch.cat([e.flags.reshape(-1) for e in window if e.flags is not None]).tolist() \
            if any(e.flags is not None for e in window) else []
        pres = [e.pre.tolist() for e in window if e.pre is not None]
        k = pi = 0
        prov = self.prov
        for e in window:
            if prov.unused:
                prov.use(e.reads)
            if e.flags is None:
                continue
            ok = flags[k : k + len(e.outs)]
            k += len(e.outs)
            pre_ok = None
            if e.pre is not None:
                pre_ok = pres[pi]
                pi += 1
            bad = [t for t, good in zip(e.outs, ok) if not good]
            if not bad:
                for t in e.mutated:
                    prov.clean(t)
                    self._forget_write(t)
                continue
            pre_bad = {id(t): not good for t, good in zip(e.mutated, pre_ok)} if pre_ok is not None else {}
            self._deferred_where = e.where
            try:
                self._on_nonfinite(e.func, e.info, e.args, e.kwargs, e.outs, bad, e.mutated, pre_bad,
                                   e.pre_stats, e.phase, e.node)
            finally:
                self._deferred_where = None

    def _note_fresh(self, info: OpInfo, outs: list[torch.Tensor]) -> None:
        """``torch.tensor(values)`` after the model ran: numbers the script computed in Python
        (returns, rewards, targets from a rollout) — the line that made it is where a non-finite
        value came from, not where it is used (a batch built before the forward is data)."""
        if info.canonical == "lift_fresh" and self.model_ran and not is_finite(outs[0]):
            self.fresh[outs[0]] = self._outside_source()

    # --- provenance ------------------------------------------------------------------------------
    def _on_nonfinite(
        self,
        func: Any,
        info: OpInfo,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        outs: list[torch.Tensor],
        bad: list[torch.Tensor],
        mutated: list[torch.Tensor],
        pre_bad: dict[int, bool],
        pre_stats: dict[int, Any],
        phase: str,
        node: Any,
    ) -> None:
        mut_ids = {id(t) for t in mutated}
        inputs = [t for t in iter_tensors(list(args) + list(kwargs.values())) if checkable(t)]
        inherited, constant = self._inherit(info, inputs, mut_ids, pre_bad, phase)
        if inherited is None and constant is not None and info.moves:
            return  # lift_fresh/clone of a literal: the op that uses it is the origin
        if (
            inherited is not None
            and inherited.deliberate
            and any(bool(torch.isnan(t).any()) for t in bad)
            and not any(bool(torch.isnan(t).any()) for t in inputs if t in self.prov)
        ):
            # an intended -inf (a mask) is fine until an op turns it into NaN — softmax over a row
            # that is masked entirely: that op made the value that does harm
            mask = inherited
            inherited = self._made_here(func, info, args, kwargs, bad[0], pre_stats, phase, node, None)
            inherited.finding.details["from_masked_inf"] = {
                "op": mask.finding.op, "source": mask.finding.source, "module": mask.finding.module,
            }
        if inherited is None:
            inherited = self._made_here(func, info, args, kwargs, bad[0], pre_stats, phase, node, constant)
        # the results of an op that returns several tensors (layer norm's mean and rstd, ...)
        # other than its first are for autograd: a value left unused there is no finding
        aux = {id(t) for t in outs[1:]} if info.aux_outputs else set()
        for t in bad:
            self.prov.mark(t, inherited, counts=id(t) not in aux)
        self._describe_batch(inherited.finding, info, bad[0])
        if info.relu and phase == "forward" and inherited.seq != -1:
            self._relu_note(phase, node)

        # sinks: a weight, a gradient or optimizer state written in place
        if mutated and phase != "backward":
            hit = [t for t in bad if id(t) in mut_ids]
            for t in hit:
                self._note_write(inherited, t)
            pnames = [n for n in (self.param_name(t) for t in hit) if n]
            is_grad = self.opts.is_grad
            if pnames:
                self._reached(inherited, "parameters", parameters=pnames, op_now=info.name)
            elif hit and is_grad is not None and any(is_grad(t) for t in hit):
                gnames = [n for n in (is_grad(t) for t in hit) if n]
                self._reached(inherited, "gradients", gradients=gnames, op_now=info.name)
            elif hit and self.in_optimizer:
                self._reached(inherited, "optimizer state", op_now=info.name)

    def _inherit(
        self, info: OpInfo, inputs: list[torch.Tensor], mut_ids: set[int], pre_bad: dict[int, bool], phase: str
    ) -> tuple[Origin | None, float | None]:
        """The origin an op's non-finite output inherits — the earliest of its tracked inputs, or a
        bad input from outside — and the value of a one-element literal input, if one was bad."""
        inherited: Origin | None = None
        for t in inputs:
            o = self.prov.get(t)
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
                inherited = self._written_origin(t) or self._external_origin(t, phase)
                break
        return inherited, constant

    def _written_origin(self, t: torch.Tensor) -> Origin | None:
        """The origin that wrote the non-finite values ``t`` holds through an alias of it
        (``w.data.div_(0)`` before ``w`` was known as a weight); a weight now, that is a sink."""
        o = self._writes.get(storage_key(t)) if self._writes else None
        if o is None or not o.judged:
            return None  # a literal written into the batch (``x[9, 3] = inf``) is the data's
        pname = self.param_name(t)
        if pname:
            self._reached(o, "parameters", parameters=[pname])
        return o

    def _made_here(
        self, func: Any, info: OpInfo, args: Sequence[Any], kwargs: dict[str, Any], out: torch.Tensor,
        pre_stats: dict[int, Any], phase: str, node: Any, literal: float | None,
    ) -> Origin:
        o = self._new_origin(func, info, args, kwargs, out, pre_stats, phase, node, info.name, literal)
        # a value made in the forward pass or the update is judged wherever it goes; one made by
        # the backward pass only at the gradients (autograd, not the user, decides where it goes)
        o.judged = o.judged and self._report_unused and phase != "backward"
        return o

    def _describe_batch(self, f: Finding, info: OpInfo, b: torch.Tensor) -> None:
        if f.phase == "data" and not f.details.get("batch_final"):
            if info.selects or info.moves:
                # the batch is still being taken out of a larger tensor: describe what came out
                f.nan, f.posinf, f.neginf = counts(b)
                f.dtype, f.shape = _fmt_dtype(b), tuple(b.shape)
                f.details["samples"] = bad_samples(b)
            else:
                f.details["batch_final"] = True

    def _relu_note(self, phase: str, node: Any) -> None:
        """Early TensorFlow checked the forward input of every ReLU when building its gradient: the
        last ReLU a non-finite value passes through is where "ReluGrad input is not finite" fired,
        first thing in the backward pass."""
        path, typ, src, _code = self._location(phase, node)
        where = f"`{path}` ({typ})" if path else (f"the {typ}" if typ else "a relu")
        self.relu_grad_where = where
        self.relu_grad_note = (
            f"TensorFlow's old `ReluGrad input is not finite` would have fired at {where}"
            + (f", {src}" if src else "") + ", in the backward pass"
        )
