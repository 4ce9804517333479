"""The optimizer step under the locator: untraced with one fused check, op by op only on failure.

A part the locator's dispatch mode (:mod:`._mode`) owns; its two methods are global optimizer
pre/post-step hooks while the locator is active. An optimizer step is dozens of small in-place
ops per weight: with ``optimizer="fast"`` the step runs untraced on a copy-protected state and one
fused check follows it. Only when that check fails is the step undone and run again op by op, to
name the op that made the weights non-finite (``aten.addcdiv_`` for Adam with ``eps=0``).
Closures (LBFGS) run as forward and backward passes again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ._stats import all_finite, checkable

if TYPE_CHECKING:
    from ._mode import LocatorMode

__all__ = ["OptimizerSteps"]


class OptimizerSteps:
    """``pre`` / ``post``: the optimizer phase of a traced step (of the locator ``mode``)."""

    def __init__(self, mode: LocatorMode) -> None:
        self.mode = mode
        self._opt_fast: tuple[Any, list[torch.Tensor], dict[Any, dict[str, Any]]] | None = None

    def pre(self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Global optimizer pre-step hook while tracing (see the module docstring)."""
        mode = self.mode
        mode.flush()
        mode.in_optimizer += 1
        # torch passes the bound call's positional args, the optimizer itself first
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if closure is not None:
            def wrapped() -> Any:
                mode.in_optimizer -= 1
                try:
                    return closure()
                finally:
                    mode.in_optimizer += 1

            if "closure" in kwargs:
                return args, {**kwargs, "closure": wrapped}
            return (args[0], wrapped, *args[2:]), kwargs
        if (
            mode.opts.optimizer == "fast"
            and mode.in_optimizer == 1
            and self._opt_fast is None
            and _get_current_dispatch_mode() is mode
        ):
            mode.__exit__(None, None, None)  # first: the copies below need no tracing
            params = [p for g in opt.param_groups for p in g["params"]]
            with torch.no_grad():
                saved = {
                    p: {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in opt.state[p].items()}
                    for p in params
                    if p in opt.state
                }
                self._opt_fast = (opt, [p.clone() for p in params], saved)
        return None

    def post(self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Global optimizer post-step hook while tracing (see the module docstring)."""
        mode = self.mode
        mode.in_optimizer = max(0, mode.in_optimizer - 1)
        mode.post_backward = False
        fast = self._opt_fast
        if fast is None or fast[0] is not opt:
            mode.flush()
            return
        self._opt_fast = None
        params = [p for g in opt.param_groups for p in g["params"]]
        state = [v for p in params for v in opt.state.get(p, {}).values()
                 if isinstance(v, torch.Tensor) and checkable(v)]
        ok = all_finite([*params, *state])
        if not ok:
            _undo(opt, params, fast)
        mode.__enter__()
        if ok:
            return
        # ... and run it again, op by op, under this locator
        raw = getattr(type(opt).step, "__wrapped__", None)
        mode.in_optimizer += 1
        try:
            if raw is not None:
                raw(opt)  # without the hooks: nothing else sees this second run
        finally:
            mode.in_optimizer = max(0, mode.in_optimizer - 1)


def _undo(
    opt: torch.optim.Optimizer,
    params: list[torch.Tensor],
    fast: tuple[Any, list[torch.Tensor], dict[Any, dict[str, Any]]],
) -> None:
    """Weights and optimizer state as they were before the step."""
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
