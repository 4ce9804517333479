"""The torch guard's hooks around each ``backward()``, a loss scaler's ``step`` and
``clip_grad_norm_``.

* ``backward()``: its roots (the loss) join the step's check; without an optimizer (yet) it is
  the step marker and the check runs right after it. On a step the tape did not keep whole (a
  rollout with grad), a non-finite loss has its graph read before backward frees it.
* ``GradScaler.step``: a skip is the scaler's own business (never a finding, also before any
  optimizer step ran), unless the loss is NaN or the scale ran out of room.
* ``clip_grad_norm_``: the total norm it returned joins the check (an overflow it swallowed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from . import _autograd, _dist
from ._backend import apply_settings, maybe_snapshot
from ._graph_origin import graph_origin
from ._guard_base import GuardBase, scale_of
from ._stats import checkable, is_finite
from ._untraced import untraced
from ._watched import opt_params
from .locator import graph_leaves
from .watch import NormCheck, check

__all__ = ["BackwardHooks"]


class BackwardHooks(GuardBase, _autograd.BackwardListener):
    """Called by the global backward wrapper and by the class-level patches (``_patches``)."""

    def before(self, kind: str, roots: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None],
               inputs: Sequence[torch.Tensor] | None) -> None:
        if self._in_opt_step and not self._in_closure:
            return  # the optimizer's own autograd calls are not the step's backward
        self.recorder.backward(kind, roots, grads, inputs)
        self.recorder.paused += 1
        self.recorder.tape_off()
        if self.recorder.incomplete and kind == "backward":
            self._read_graph(roots)
        for r in roots:
            if isinstance(r, torch.Tensor):
                self._losses.append(r.detach())
        if self.watch.primary is None and self.watch.leaves is None and kind == "backward":
            self.watch.leaves = list(inputs) if inputs else graph_leaves(roots)

    @untraced
    def _read_graph(self, roots: Sequence[torch.Tensor]) -> None:
        """Before a ``backward()`` of a step the tape did not keep whole: is its loss finite
        (one host read; not in the deferred watch, which reads nothing on the host)? If not,
        the graph it is about to free shows where the value came from (``_graph_origin``)."""
        rec = self.recorder
        if self._defer or rec.graph_finding is not None:
            return
        with torch.no_grad():
            bad = [r for r in roots if isinstance(r, torch.Tensor) and checkable(r) and not is_finite(r)]
            if bad:
                rec.graph_finding = graph_origin(bad, self.step)

    def after(self, kind: str, roots: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor] | None,
              result: Any) -> None:
        if self._in_opt_step and not self._in_closure:
            return
        try:
            if kind == "backward" and not self._in_closure:
                self.backward_calls += 1
                if self.watch.primary is None:
                    self._after_backward_step()
        finally:
            # the check's own ops are not part of the user's step: record again only after it
            self.recorder.paused -= 1
            if not self.recorder.paused and not self.modules.depth:
                self.recorder.tape_on()

    def _after_backward_step(self) -> None:
        """No optimizer (yet): ``backward()`` is the step marker. Check the gradients — and the
        weights, whose growth is the evidence for a learning rate that is too high — now."""
        leaves = self.watch.leaves or []
        self._n_losses = len(self._losses)
        chk, pchk = check([p.grad for p in leaves], self._losses, leaves)
        if not chk.finite and self._scaler_owns(chk):
            return  # a loss scaler's scaled gradients: its step() decides (see scaler_step)
        if self.verify and pchk is not None and not pchk.finite and self._backward_steps:
            self.violations.append({"step": self.step - 1, "tensors": ["weights (no optimizer)"]})
        ok, bad_ranks = _dist.agree(chk.finite, leaves)
        try:
            if ok:
                self.controller.healthy()
                maybe_snapshot(self, before_update=True)
                apply_settings(self, leaves, None, chk.norm)
            else:
                self._failure(chk, leaves, bad_ranks, opt=None)
        finally:
            self._record(chk, pchk, None)
            self._end_step()
            self._backward_steps += 1

    def loss_scaled(self, scaler: Any, outputs: Any) -> None:
        """``GradScaler.scale(loss)`` was called: the scaler is this run's; keep the unscaled
        loss — a scale far too large (``init_scale=2**127``) can overflow the scaled one; the loss
        is bad only if it is."""
        self._scalers.add(scaler)
        ts = [outputs] if isinstance(outputs, torch.Tensor) else [
            t for t in (outputs if isinstance(outputs, (list, tuple)) else []) if isinstance(t, torch.Tensor)]
        self._unscaled.extend(t.detach() for t in ts if t.is_floating_point())

    def _loss_bad(self) -> bool:
        """Is the step's loss itself not finite (NaN, or Inf from a forward overflow)? Read from
        the unscaled loss when a GradScaler scaled it, else from the backward's roots."""
        ts = self._unscaled or self._losses
        return not all(bool(torch.isfinite(x).all()) for x in ts)

    def _scaler_owns(self, chk: NormCheck) -> bool:
        """Non-finite gradients from a finite loss while a dynamic loss scaler with room to
        shrink is alive: the scaler skips this update itself (its first steps often do)."""
        if self._loss_bad():
            return False  # the loss itself is not finite: no scale can fix it
        return any(scale_of(s) > 1.0 for s in self._scalers_all())

    def clip_called(self, total_norm: Any, max_norm: float) -> None:
        """After ``torch.nn.utils.clip_grad_norm_``: when the total norm overflowed, every gradient
        was scaled by 0 and the returned inf is the only trace — it joins the step's check."""
        if self._trialing:
            return
        if isinstance(max_norm, (int, float)) and math.isfinite(max_norm):
            self.clip_norm = float(max_norm)
        if isinstance(total_norm, torch.Tensor) and checkable(total_norm):
            self._clip_norms.append(total_norm)  # made under no_grad; the check detaches it
            ref = self.recorder._made.get(total_norm)
            if ref is not None:
                self._sinks.append((ref, "total gradient norm that clip_grad_norm_ returned"))

    def scaler_step(self, scaler: Any, optimizer: torch.optim.Optimizer, stepped: bool) -> None:
        """After ``GradScaler.step``: its own skipped steps are not failures — also before any
        optimizer step ran — unless the loss itself is NaN or it keeps skipping."""
        self._scalers.add(scaler)
        if self.watch.primary is None:
            self._adopt_primary(optimizer)
        if stepped:
            self.controller.scaler_stepped()
            return
        nan_loss = self._loss_bad()  # a loss that is itself not finite is no scale's doing
        reason = self.controller.scaler_skipped(nan_loss=nan_loss, scale=scale_of(scaler))
        self._n_losses = len(self._losses)
        if reason is None:
            # the scaler's own business: its loss scale overflowed, it lowers the scale
            self.step_was_skipped = True
            self._event_tag = "scaler-skip"
            self._record(None, None, optimizer)
            self._end_step()
            return
        chk = NormCheck(False, None, losses=[float("nan")] if nan_loss else [])
        try:
            self._failure(chk, opt_params(optimizer), [], opt=optimizer, note=reason)
        finally:
            self._hidden_grads = []
            self._record(None, None, optimizer, finite=False)
            self._end_step()
