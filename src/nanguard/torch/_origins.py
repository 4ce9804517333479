"""Origins: the finding made when an op, or a tensor from outside, first holds NaN/Inf.

A layer of the locator's dispatch mode (:mod:`._mode`), run only on the non-finite path: when an
op's output is not finite and no input it read was already tracked. The finding is filled in at
once (op, phase, module, source line, input statistics, the producer of each input when it
explains a singularity) but reported later, if ever: when the values reach a sink, or, for an
op that made them from finite inputs, when they are left unused (:mod:`._provenance`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..core.finding import Finding
from ..core.ops import LOW_PRECISION
from ._batches import batch_source, stored_row_finite
from ._opinfo import OpInfo, op_info
from ._place import Place, custom_function
from ._provenance import IdMap, Origin, Provenance
from ._stats import checkable, finding_for, iter_tensors, tensor_stats

__all__ = ["Origins", "bad_samples", "is_log_mask"]

log = logging.getLogger("nanguard")

_LOW = (torch.float16, torch.bfloat16)


class Origins(Place):
    """Making :class:`Origin` objects (the locator's provenance layer)."""

    prov: Provenance
    producers: IdMap
    fresh: IdMap
    step: int | None

    def _stamp(self, f: Finding, *, judged: bool = False, deliberate: bool = False) -> Origin:
        return Origin(f, deliberate=deliberate, judged=judged and not deliberate, born=self.prov.boundary)

    def _external_origin(self, t: torch.Tensor, phase: str) -> Origin:
        """``t`` came in non-finite from outside the locator: a weight, the batch or a literal."""
        pname = self.param_name(t) if not isinstance(t, nn.Parameter) else (self.param_name(t) or "parameter")
        if pname is not None or isinstance(t, nn.Parameter):
            mod = pname.rsplit(".", 1)[0] if pname and "." in pname else ("" if pname else None)
            f = finding_for(
                t,
                phase if phase != "data" else "forward",
                "parameter",
                module=mod,
                step=self.step,
                detected_by=self.opts.detected_by,
                details={"origin": "parameter", "parameters": [pname] if pname else []},
            )
            return self._stamp(f)
        path, typ = self.modules.current()
        made = self.fresh.get(t)
        loc = made if made is not None else self._outside_source()
        # made from Python numbers in this step (torch.tensor of computed values): not data
        details: dict[str, Any] = {"origin": "computed" if made is not None else "data",
                                   "samples": bad_samples(t)}
        if made is None:
            try:
                _name_batch(details, t)
            except Exception:  # the batch's row and key are extra: a finding is not lost to them
                log.debug("nanguard: naming the batch's rows failed", exc_info=True)
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
            detected_by=self.opts.detected_by,
            details=details,
        )
        return self._stamp(f, deliberate=t.numel() <= 1)

    def _new_origin(
        self,
        func: Any,
        info: OpInfo,
        args: Sequence[Any],
        kwargs: dict[str, Any],
        out: torch.Tensor,
        pre_stats: dict[int, Any],
        phase: str,
        node: Any,
        name: str,
        literal: float | None = None,
    ) -> Origin:
        """This op made non-finite values from finite inputs, or from a deliberate constant: a
        non-finite scalar argument, or ``literal``, the value of a one-element tensor."""
        module, mtype, source, code = self._location(phase, node)
        stats, scalars, producers, constant = self._describe_inputs(info, args, kwargs, pre_stats)
        if literal is not None:
            constant = str(literal)
        grad_fn = node.name() if node is not None else None
        details: dict[str, Any] = {}
        fn_name = custom_function(node) if phase == "backward" else None
        if fn_name is not None:
            details["custom_function"] = fn_name  # the op ran in its hand-written backward
        if constant is not None:
            # made from an explicit inf/nan argument (masked_fill(mask, -inf), full(..., nan))
            details["constant"] = constant
        if producers:
            details["input_producers"] = producers[:4]
        if phase == "optimizer":
            pnames = [n for n in (self.param_name(t) for t in iter_tensors(args[:1])) if n]
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
            detected_by=self.opts.detected_by,
            inputs=stats,
            scalars=scalars,
            details=details,
        )
        if (f.posinf or f.neginf) and f.dtype in LOW_PRECISION:
            _float32_check(func, args, kwargs, f)
        if self.opts.run_of is not None:  # the run of its line now, not when a sink meets it
            run = self.opts.run_of(source)
            if run:
                f.details["run"] = run
        deliberate = constant is not None or (not producers and is_log_mask(info, args))
        return self._stamp(f, judged=True, deliberate=deliberate)

    def _describe_inputs(
        self, info: OpInfo, args: Sequence[Any], kwargs: dict[str, Any], pre_stats: dict[int, Any]
    ) -> tuple[list[Any], dict[str, Any], list[str], str | None]:
        """(input statistics, scalar arguments, producers of the inputs, a non-finite constant)."""
        stats = []
        scalars: dict[str, Any] = {}
        producers: list[str] = []
        constant: str | None = None
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
                if isinstance(v, float) and not math.isfinite(v) and constant is None:
                    constant = str(v)
        return stats, scalars, producers, constant


def is_log_mask(info: OpInfo, args: Sequence[Any]) -> bool:
    """``torch.log(torch.tril(torch.ones(T, T)))``: the log of a tensor of exact 0s and 1s (both
    present) that no softmax/sigmoid/exp made — an additive ``-inf`` mask made on purpose."""
    if info.canonical not in ("log", "log2", "log10") or not args or not isinstance(args[0], torch.Tensor):
        return False
    x = args[0]
    if not checkable(x) or x.numel() < 2:
        return False
    zero, one = x == 0, x == 1
    return bool((zero | one).all()) and bool(zero.any()) and bool(one.any())


def _float32_check(func: Any, args: Sequence[Any], kwargs: dict[str, Any], f: Finding) -> None:
    """Re-run a low-precision op in float32: would it have stayed finite?"""
    try:

        def up(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.dtype in _LOW:
                return x.detach().float()
            if isinstance(x, torch.dtype) and x in _LOW:
                return torch.float32
            if isinstance(x, (list, tuple)):
                return type(x)(up(v) for v in x)
            return x

        if op_info(func).inplace:
            return
        out32 = func(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()})
        t = next(iter(iter_tensors(out32)), None)
        if t is not None and t.is_floating_point():
            fin = bool(torch.isfinite(t).all())
            f.details["float32_finite"] = fin
            if fin:
                f.details["float32_absmax"] = float(t.abs().max())
    except Exception:  # the float32 re-run is evidence, never a requirement
        log.debug("nanguard: the float32 re-run of %s failed", func, exc_info=True)
        return


def _name_batch(details: dict[str, Any], t: torch.Tensor) -> None:
    """A batch a DataLoader handed out: its key (``the batch's `['labels']` ``) and each bad
    sample's dataset index through the sampler (a shuffled batch's position tells nothing)."""
    src = batch_source(t)
    if not src:
        return
    if "key" in src:
        details["input_name"] = f"the batch's `{src['key']}`"
    rows = src.get("rows")
    if rows:
        for s in details["samples"]:
            i = s.get("index")
            if isinstance(i, int) and 0 <= i < len(rows):
                s["dataset_index"] = rows[i]
        first = next((s["dataset_index"] for s in details["samples"] if "dataset_index" in s), None)
        ds = src.get("dataset")
        if first is not None and ds is not None and stored_row_finite(ds, first) is True:
            # what the dataset holds for that row is finite: reading the sample made the NaN
            details["read_computed"] = f"{type(ds).__name__}.__getitem__"


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
