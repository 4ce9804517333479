"""The torch guard's hooks around each ``backward()``, a loss scaler's ``step`` and
``clip_grad_norm_`` (and the start of a ``DataLoader`` epoch).

* ``backward()``: its roots (the loss) join the step's check; without an optimizer (yet) it is
  the step marker and the check runs right after it. On a step the tape did not keep whole (a
  rollout with grad), a non-finite loss has its graph read before backward frees it.
* ``GradScaler.step``: a skip is the scaler's own business (never a finding, also before any
  optimizer step ran), unless the loss is NaN or the scale ran out of room.
* ``clip_grad_norm_``: the total norm it returned joins the check (an overflow it swallowed).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from . import _autograd
from ._graph_origin import graph_origin
from ._stats import checkable, is_finite
from ._step import TorchStep, Where
from ._untraced import untraced
from ._watched import opt_params
from .locator import graph_leaves
from .watch import NormCheck, check

if TYPE_CHECKING:
    from .guard import Guard

__all__ = ["BackwardHooks", "scale_of"]

log = logging.getLogger("nanguard")


class BackwardHooks(_autograd.BackwardListener):
    """Called by the global backward wrapper and by the class-level patches (``_patches``).

    Attributes:
        calls: ``backward()`` calls seen (outside optimizer steps' own autograd).
        seen: a ``backward()`` has started, anywhere but in an optimizer's own autograd (in
            an ``optimizer.step(closure)`` too, where ``calls`` does not count it).
        script_clip: the ``max_norm`` the script's own ``clip_grad_norm_`` clips at.
    """

    def __init__(self, guard: Guard, step: TorchStep) -> None:
        self.g = guard
        self.step = step
        self.calls = 0
        self.seen = False
        self.script_clip: float | None = None
        self._live_checked = False  # the leaves' storage looked at (once: see _after_backward_step)

    def before(self, kind: str, roots: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None],
               inputs: Sequence[torch.Tensor] | None) -> None:
        if self.step.where is Where.OPTIMIZER:
            return  # the optimizer's own autograd calls are not the step's backward
        g = self.g
        self.seen = self.seen or kind == "backward"
        g.recorder.backward(kind, roots, grads, inputs)
        g.recorder.hold()
        if g.recorder.incomplete and kind == "backward":
            self._read_graph(roots)
        for r in roots:
            if isinstance(r, torch.Tensor):
                self.step.losses.append(r.detach())
        watch = g.watch
        if watch.primary is None and watch.leaves is None and kind == "backward":
            watch.leaves = list(inputs) if inputs else graph_leaves(roots)

    @untraced
    def _read_graph(self, roots: Sequence[torch.Tensor]) -> None:
        """Before a ``backward()`` of a step the tape did not keep whole: is its loss finite
        (one host read; not in the deferred watch, which reads nothing on the host)? If not,
        the graph it is about to free shows where the value came from (``_graph_origin``)."""
        rec = self.g.recorder
        if self.g.opt_hooks.defer or rec.graph_finding is not None:
            return
        with torch.no_grad():
            bad = [r for r in roots if isinstance(r, torch.Tensor) and checkable(r) and not is_finite(r)]
            if bad:
                rec.graph_finding = graph_origin(bad, self.g.driver.step)

    def after(self, kind: str, roots: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor] | None,
              result: Any) -> None:
        if self.step.where is Where.OPTIMIZER:
            return
        try:
            if kind == "backward" and self.step.where is not Where.CLOSURE:
                self.calls += 1
                if self.g.watch.primary is None:
                    self._after_backward_step()
        finally:
            # the check's own ops are not part of the user's step: record again only after it
            self.g.recorder.release()

    def _after_backward_step(self) -> None:
        """No optimizer (yet): ``backward()`` is the step marker. Check the gradients — and the
        weights, whose growth is the evidence for a learning rate that is too high — now."""
        g, st = self.g, self.step
        leaves = g.watch.leaves or []
        if leaves and not self._live_checked:
            # FSDP2's unsharded parameters are the graph's leaves, their storage freed after
            # backward (the real weights are sharded DTensors): never read freed memory
            self._live_checked = True
            leaves = g.watch.leaves = [t for t in leaves if _has_storage(t)]
        st.n_losses = len(st.losses)
        chk, pchk = check([p.grad for p in leaves], st.losses, leaves)
        if not chk.finite and self._scaler_owns():
            return  # a loss scaler's scaled gradients: its step() decides (see scaler_step)
        if pchk is not None and not pchk.finite and g.watch.backward_steps:
            g.verifier.breach(g.driver.step - 1, ["weights (no optimizer)"])
        st.check = chk
        try:
            g.driver.check(chk.finite, g.port(leaves, None, chk, st.sinks), checks_after=False)
        finally:
            g.end_step(chk, pchk, None)
            g.watch.backward_steps += 1

    def loss_scaled(self, scaler: Any, outputs: Any) -> None:
        """``GradScaler.scale(loss)`` was called: the scaler is this run's; keep the unscaled
        loss — a scale far too large (``init_scale=2**127``) can overflow the scaled one; the loss
        is bad only if it is."""
        self.g.actuator.scalers.add(scaler)
        ts = [outputs] if isinstance(outputs, torch.Tensor) else [
            t for t in (outputs if isinstance(outputs, (list, tuple)) else []) if isinstance(t, torch.Tensor)]
        self.step.unscaled.extend(t.detach() for t in ts if t.is_floating_point())

    def loss_bad(self) -> bool:
        """Is the step's loss itself not finite (NaN, or Inf from a forward overflow)? Read from
        the unscaled loss when a GradScaler scaled it, else from the backward's roots."""
        ts = self.step.unscaled or self.step.losses
        return not all(bool(torch.isfinite(x).all()) for x in ts)

    def _scaler_owns(self) -> bool:
        """Non-finite gradients from a finite loss while a dynamic loss scaler with room to
        shrink is alive: the scaler skips this update itself (its first steps often do)."""
        if self.loss_bad():
            return False  # the loss itself is not finite: no scale can fix it
        return any(scale_of(s) > 1.0 for s in self.g.actuator.scalers_all())

    def clip_called(self, total_norm: Any, max_norm: float) -> None:
        """After ``torch.nn.utils.clip_grad_norm_``: when the total norm overflowed, every gradient
        was scaled by 0 and the returned inf is the only trace — it joins the step's check."""
        if self.g.actuator.trialing:
            return
        if isinstance(max_norm, (int, float)) and math.isfinite(max_norm):
            self.script_clip = float(max_norm)
        if isinstance(total_norm, torch.Tensor) and checkable(total_norm):
            self.step.clip_norms.append(total_norm)  # made under no_grad; the check detaches it
            ref = self.g.recorder._made.get(total_norm)
            if ref is not None:
                self.step.sinks.append((ref, "total gradient norm that clip_grad_norm_ returned"))

    def scaler_step(self, scaler: Any, optimizer: torch.optim.Optimizer, stepped: bool) -> None:
        """After ``GradScaler.step``: its own skipped steps are not failures — also before any
        optimizer step ran — unless the loss itself is NaN or it keeps skipping."""
        g, st = self.g, self.step
        g.actuator.scalers.add(scaler)
        if g.watch.primary is None:
            g.opt_hooks.adopt_primary(optimizer)
        if stepped:
            g.controller.scaler_stepped()
            return
        nan_loss = self.loss_bad()  # a loss that is itself not finite is no scale's doing
        st.n_losses = len(st.losses)
        chk = NormCheck(False, None, losses=[float("nan")] if nan_loss else [])
        own = False
        try:
            port = g.port(opt_params(optimizer), optimizer, chk, st.sinks)
            own = g.driver.scaler_skipped(port, nan_loss=nan_loss, scale=scale_of(scaler))
        finally:
            if not own:
                g.actuator.forget_hidden()
            g.end_step(None, None, optimizer, finite=None if own else False)

    def loader_started(self, loader: Any) -> None:
        """A ``DataLoader`` created its iterator: the data look (``_patches``)."""
        self.g.data.loader_started(loader, self.g.driver.step)


def _has_storage(t: torch.Tensor) -> bool:
    """Does ``t``'s storage hold its elements (not freed by a resize to 0, as FSDP2 does)?"""
    try:
        need = (t.storage_offset() + t.numel()) * t.element_size()
        return t.untyped_storage().nbytes() >= need
    except (RuntimeError, NotImplementedError):  # no storage to ask (a subclass): not readable
        return False


def scale_of(scaler: Any) -> float:
    """A loss scaler's current scale (NaN when it cannot be read)."""
    try:
        return float(scaler.get_scale())
    except Exception:  # a scaler nanguard cannot read: its scale is unknown
        log.debug("nanguard: cannot read the scale of %s", type(scaler).__name__, exc_info=True)
        return float("nan")
