"""What the Keras guard tells of a step: its history record (after every step, from the one read
of the traced check's numbers) and the run context a diagnosis reads (only after a failure)."""

from __future__ import annotations

import inspect
import logging
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.diagnosis import RunContext
from ..core.step import Reading
from .watch import GuardState, StepStats

if TYPE_CHECKING:
    from .guard import KerasGuard

__all__ = ["eps_of", "record_reading", "run_context"]

log = logging.getLogger("nanguard")

_HYPER = ("momentum", "beta_1", "beta_2", "weight_decay", "rho", "nesterov")


def eps_of(state: GuardState) -> float | None:
    if state.eps is not None:
        return float(state.eps.numpy())
    e = getattr(state.optimizer, "epsilon", None)
    return float(e) if isinstance(e, (int, float)) else None


def kept_args(opt: Any) -> dict[str, Any]:
    """The plain-number arguments of a Keras optimizer that differ from its class's defaults,
    besides the learning rate: what a suggested ``keras.optimizers.X(...)`` line keeps."""
    try:
        sig = inspect.signature(type(opt).__init__)
    except (TypeError, ValueError):
        return {}
    out = {}
    for name, p in sig.parameters.items():
        if name in ("self", "learning_rate", "name") or p.default is inspect.Parameter.empty:
            continue
        v = getattr(opt, name, None)
        if isinstance(v, (bool, int, float)) and isinstance(p.default, (bool, int, float, type(None))) \
                and v != p.default:
            out[name] = v
    return out


def run_context(guard: KerasGuard, state: GuardState | None = None) -> RunContext:
    """What the diagnosis knows about the optimizer (Keras spelling of the fixes)."""
    if state is None:
        state = next(iter(guard.states()), None)
    if state is None:
        return RunContext(framework="keras")
    opt = state.optimizer
    hyper: dict[str, Any] = {}
    lr = next((r.lr for r in reversed(list(guard.history)) if r.lr is not None), None)
    if lr is None:
        try:
            lr = float(np.asarray(opt.learning_rate)) * guard.recovery_state.lr_scale
        except Exception:  # a schedule nanguard cannot evaluate here: no learning rate said
            log.debug("nanguard: cannot read the learning rate", exc_info=True)
            lr = None
    if lr is not None:
        hyper["lr"] = lr
    eps = eps_of(state)
    if eps is not None:
        hyper["epsilon"] = eps
    for k in _HYPER:
        v = getattr(opt, k, None)
        if isinstance(v, (int, float)):
            hyper[k] = v
    clip = None
    for k in ("global_clipnorm", "clipnorm"):
        v = getattr(opt, k, None)
        if isinstance(v, (int, float)) and v > 0:
            clip = float(v)
    n = sum(int(np.prod(v.shape)) for v in state.var_refs) or None
    return RunContext(
        framework="keras",
        optimizer=type(opt).__name__,
        hyper=hyper,
        kept=kept_args(opt),
        clip_norm=clip if clip is not None else guard.recovery_state.clip_norm,
        num_params=n,
        loss_scaler=type(opt).__name__ == "LossScaleOptimizer",
        argv=tuple(sys.argv[1:]),
    )


def record_reading(state: GuardState, s: StepStats, finite: bool) -> Reading:
    """The step's reading for its history record (the traced check's numbers, read once)."""
    return Reading(
        finite=finite, loss=s.loss, grad_norm=s.grad_norm, param_norm=s.param_norm if finite else None,
        lr=s.lr, opt_type=type(state.optimizer).__name__, num_params=state.n_params or None,
        estimate_update=finite,
        layer_values=s.grad_norms if s.grad_norms and state.var_names else None,
        layer_names=state.var_names if s.grad_norms and state.var_names else None,  # one shared list
    )
