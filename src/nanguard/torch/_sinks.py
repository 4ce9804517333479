"""Sinks: when a tracked non-finite value becomes a finding.

A layer of the locator's dispatch mode (:mod:`._mode`). An origin is reported (raised with
``on_sink="raise"``, appended to ``findings`` with ``"record"``) when its values reach

* the root of a backward pass (the loss) — checked before the engine runs;
* a gradient written to a leaf — checked after each backward pass;
* a weight, gradient or optimizer state written in place (by the op itself, :mod:`._mode`);
* the input of an op that then raised (``multinomial`` on NaN probabilities);

and, with ``unused="report"`` (``locate()``, ``--trace``), for an origin made by an op from
finite inputs, also

* Python, reading one of its values (``.item()``, ``float(t)``) — at once;
* nothing: at the end of the ``locate()`` block, of the script, or of the step after the one it
  was made in (a ``--trace`` run), one of its values was still unused or had been dropped unused,
  or a weight it wrote still holds it. See :mod:`._provenance` for what "used" means.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from ..core.errors import NonFiniteError
from ..core.finding import Finding
from ..core.source import user_frame
from . import _dist
from ._modules import storage_key
from ._origins import Origins
from ._provenance import Origin
from ._stats import checkable, finding_for, is_finite, iter_tensors

__all__ = ["Sinks"]


class Sinks(Origins):
    """Reporting findings: the sinks of the locator."""

    findings: list[Finding]
    relu_grad_note: str | None
    relu_grad_where: str | None

    def flush(self) -> None:  # the dispatch layer's (one sync for the deferred checks)
        raise NotImplementedError

    def _init_sinks(self) -> None:
        self._wrote: list[Origin] = []  # judged origins that wrote non-finite values in place
        self._writes: dict[int, Origin] = {}  # storage -> origin that wrote non-finite values there

    # --- reporting ------------------------------------------------------------------------------------
    def _reached(self, origin: Origin, what: str, **details: Any) -> None:
        f = origin.finding
        f.mark_reached(what, self.step, **details)
        if what == "parameters" and f.module is None and f.phase != "backward" and details.get("parameters"):
            first = details["parameters"][0]
            f.module = first.rsplit(".", 1)[0] if "." in first else ""  # the weight's module
        if self.relu_grad_note and "relu_grad" not in f.details:
            f.details["relu_grad"] = self.relu_grad_note
            f.details["relu_grad_layer"] = self.relu_grad_where
        self.prov.close(origin)
        if any(x is f for x in self.findings):
            return
        self.findings.append(f)
        if self.opts.on_sink == "raise" and not (self.opts.defer_across_ranks and _dist.active()):
            raise NonFiniteError(f)

    def reach(self, origin: Origin, what: str, **details: Any) -> None:
        """A value of ``origin`` reached ``what``, a sink only the caller knows (the replay's
        total norm that ``clip_grad_norm_`` returned)."""
        self._reached(origin, what, **details)

    def origin_of(self, t: torch.Tensor) -> Origin | None:
        return self.prov.get(t)

    # --- the loss and the gradients ----------------------------------------------------------------
    def check_roots(self, roots: Sequence[torch.Tensor]) -> None:
        """Before a backward pass: is the loss (the root) already non-finite?"""
        self.flush()
        self._flush_pending()
        with self.own_ops():
            self._check_roots(roots)

    def _check_roots(self, roots: Sequence[torch.Tensor]) -> None:
        for r in roots:
            if isinstance(r, torch.Tensor) and checkable(r) and not is_finite(r):
                origin = self.origin_of(r)
                if origin is None:
                    origin = self._external_origin(r, "forward")
                self._reached(origin, "loss")

    def check_grads(self, leaves: Sequence[torch.Tensor], grads: Sequence[Any] | None = None) -> None:
        """After a backward pass: did a non-finite value reach a gradient?"""
        self.flush()
        with self.own_ops():
            self._check_grads(leaves, grads)

    def _check_grads(self, leaves: Sequence[torch.Tensor], grads: Sequence[Any] | None) -> None:
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
                    detected_by=self.opts.detected_by,
                    details={"note": "the gradient was non-finite before this backward pass"},
                )
            )
        names = [n for n in (self.param_name(leaf) for leaf, _ in bad) if n]
        self._reached(best, "gradients", gradients=names)

    def _on_failed_op(self, func: Any, args: Any, kwargs: dict[str, Any], exc: Exception) -> None:
        """An op raised (``multinomial`` on NaN probabilities, ...): was a non-finite input why?"""
        if isinstance(exc, NonFiniteError):
            return
        inputs = [t for t in iter_tensors(list(args) + list(kwargs.values())) if checkable(t)]
        origin: Origin | None = None
        for t in inputs:
            o = self.prov.get(t)
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

    # --- values that went nowhere ----------------------------------------------------------------------
    def _on_read(self, func: Any, flat_args: Sequence[torch.Tensor]) -> None:
        """Python reads a value (``.item()``): a judged origin's value is reported there."""
        self.flush()
        for t in flat_args:
            o = self.prov.get(t)
            if o is not None and o.judged:
                loc = user_frame(2, self.opts.frame_stop)
                at = f" at {loc.short}" if loc else ""
                self._reached(o, "output", note=f"Python read one of its values (`.item()`){at}")

    def _note_write(self, origin: Origin, t: torch.Tensor) -> None:
        """``origin`` wrote non-finite values into ``t`` in place (a weight, maybe): if it is
        judged, remember where, for an alias of it met later and for the end-of-step check."""
        if not origin.judged:
            return
        self._writes[storage_key(t)] = origin
        if not origin.wrote:
            self._wrote.append(origin)
        if len(origin.wrote) < 8:
            origin.wrote.append(weakref.ref(t))

    def _forget_write(self, t: torch.Tensor) -> None:
        if self._writes:
            self._writes.pop(storage_key(t), None)

    def _judge(self, until: int | None, when: str) -> None:
        """Report the judged origins made before step boundary ``until`` (``None``: all) whose
        values lie unused, or whose weights still hold them."""
        if self.opts.unused != "report" or not (self.prov.open or self._wrote):
            return
        self.flush()
        with self.own_ops():
            self._judge_now(until, when)

    def _judge_now(self, until: int | None, when: str) -> None:
        for o in self._wrote_weights(until):
            names = [n for n in (self.param_name(t) for t in self._bad_writes(o)) if n]
            self._reached(o, "parameters", parameters=names,
                          note=f"the weights still held these values {when}")
        for o in self.prov.open_before(until):
            self._reached(o, "output", note=f"no op made these values finite again: they were unused {when}")

    def _wrote_weights(self, until: int | None) -> list[Origin]:
        """Judged origins made before ``until`` whose in-place writes left a (now named) weight
        non-finite; origins whose writes were undone or dropped are forgotten."""
        out, keep = [], []
        for o in self._wrote:
            bad = self._bad_writes(o) if o.judged else []
            if not bad:
                continue
            if (until is None or o.born < until) and any(self.param_name(t) for t in bad):
                out.append(o)
            else:
                keep.append(o)
        self._wrote = keep
        return out

    def _bad_writes(self, o: Origin) -> list[torch.Tensor]:
        ts = [r() for r in o.wrote]
        return [t for t in ts if t is not None and checkable(t) and not is_finite(t)]

    def end_step(self, step: int) -> None:
        """A step of a ``--trace`` run ended (the guard's step counter is now ``step``): report
        what was made in the step before it and is still unused — a step leaves what it made one
        more step to be used (a metric computed after ``optimizer.step()``)."""
        self.prov.boundary += 1
        self.step = step
        self._judge(self.prov.boundary - 1, "at the end of the step after the one that made them")

    def settle(self, when: str) -> None:
        """The block or the script ends: report every judged origin whose values lie unused."""
        self._judge(None, when)
