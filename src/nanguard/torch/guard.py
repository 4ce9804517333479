"""``nanguard.attach``: watch every step, replay the failing one, apply the policy.

What runs when, in a training step::

    out = model(x)            # root call recorded (args, RNG state)     -- global module hooks
    loss = crit(out, y)       # ops outside modules go on the step's tape
    loss.backward()           # roots recorded; without an optimizer: fused check afterwards
    optimizer.step()          # pre-step hook: ONE fused check of loss + gradients
                              #   non-finite -> replay the step under the locator -> diagnose
                              #   -> policy (raise / skip)
                              # post-step hook: fused check of the weights, history updated

The guard never touches the user's module objects (hooks are global), so ``torch.save(model)``
keeps working while it is attached.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..core.diagnosis import Diagnosis, RunContext, diagnose
from ..core.errors import GiveUpError, NonFiniteError
from ..core.finding import Finding
from ..core.history import History, StepRecord
from ..core.source import user_frame
from . import _autograd, _patches
from ._modules import ModuleStack
from ._recorder import StepRecorder
from ._stats import counts
from .locator import graph_leaves
from .replay import replay
from .watch import NormCheck, check_grads, check_params

__all__ = ["POLICIES", "Guard", "attach"]


from ..core.config import POLICIES

_ATTACHED: weakref.WeakKeyDictionary[Any, Guard] = weakref.WeakKeyDictionary()
_HYPER = ("lr", "eps", "momentum", "weight_decay", "betas", "alpha", "nesterov", "dampening")


class Guard(_autograd.BackwardListener):
    """The handle :func:`attach` returns. Use it as a context manager or call :meth:`detach`.

    Attributes:
        step: index of the optimizer step in progress (0 for the first).
        history: per-step loss, gradient norm, weight norm and learning rate.
        findings: ``(Finding, Diagnosis)`` for every non-finite event, in order.
        notfinite_count: consecutive steps skipped so far (as optax's ``apply_if_finite``).
        total_notfinite: all steps skipped in this run.
        step_was_skipped: whether the last optimizer step was skipped (as accelerate).
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        policy: str = "raise",
        replay: bool = True,
        max_consecutive_skips: int = 10,
        history_size: int = 10_000,
    ) -> None:
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(
                f"nanguard.attach(model=...) expects a torch.nn.Module, got {type(model).__name__}. "
                "Pass the model whose training you want to guard: nanguard.attach(model, optimizer)."
            )
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"nanguard.attach(optimizer=...) expects a torch.optim.Optimizer, got "
                f"{type(optimizer).__name__}. Pass the optimizer itself (not a scheduler or a "
                "list), or leave it out to check at every backward()."
            )
        if policy not in POLICIES:
            raise ValueError(
                f"nanguard.attach(policy={policy!r}): valid policies are {', '.join(POLICIES)}."
            )
        if max_consecutive_skips < 1:
            raise ValueError("max_consecutive_skips must be >= 1")
        self.model = model
        self.optimizer = optimizer
        self.policy = policy
        self.replay_enabled = replay
        self.max_consecutive_skips = max_consecutive_skips
        self.history = History(maxlen=history_size)
        self.findings: list[tuple[Finding, Diagnosis]] = []
        self.step = 0
        self.backward_calls = 0
        self.notfinite_count = 0
        self.total_notfinite = 0
        self.step_was_skipped = False
        self.clip_norm: float | None = None
        self.modules = ModuleStack(model)
        self.recorder = StepRecorder(self.modules)
        self._primary: torch.optim.Optimizer | None = optimizer
        self._losses: list[torch.Tensor] = []
        self._leaves: list[torch.Tensor] | None = None
        self._names: dict[int, str] = {}
        self._pending: NormCheck | None = None
        self._skipped_grads: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self._handles: list[Any] = []
        self._installed = False
        self._last_params_finite = True
        self.on_step_end: list[Any] = []  # callables run after each step (the tracer's counter)
        self._ended_by_backward = False
        self._carry_loss: float | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    def install(self) -> Guard:
        """Start watching (called by :func:`attach`)."""
        if self._installed:
            return self
        for obj, what in ((self.model, "model"), (self.optimizer, "optimizer")):
            if obj is not None:
                other = _ATTACHED.get(obj)
                if other is not None and other._installed:
                    raise RuntimeError(
                        f"nanguard is already attached to this {what}. Call guard.detach() on the "
                        "first handle (or leave its `with` block) before attaching again."
                    )
        for obj in (self.model, self.optimizer):
            if obj is not None:
                _ATTACHED[obj] = self
        self.modules.on_root_enter = self.recorder.root_enter
        self.modules.on_root_exit = self.recorder.root_exit
        self.modules.install()
        self._handles.append(_autograd.add_backward_listener(self))
        self._handles.append(_autograd.add_optimizer_listener(self._pre_step, self._post_step))
        _patches.register_recorder(self.recorder)
        self.recorder.resume_tape = True
        self.recorder.tape_on()
        self._installed = True
        return self

    def detach(self) -> None:
        """Stop watching and remove every hook. Safe to call twice."""
        if not self._installed:
            return
        self.recorder.resume_tape = False
        self.recorder.tape_off()
        _patches.unregister_recorder(self.recorder)
        for h in self._handles:
            h.remove()
        self._handles = []
        self.modules.remove()
        for obj in (self.model, self.optimizer):
            if obj is not None and _ATTACHED.get(obj) is self:
                del _ATTACHED[obj]
        self._installed = False

    def __enter__(self) -> Guard:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    # --- names and context ---------------------------------------------------------------------
    def _param_names(self) -> dict[int, str]:
        roots: list[nn.Module] = [self.model] if self.model is not None else []
        roots += [m for m in self.modules.roots_seen if m is not self.model]
        if not self._names or len(self._names) < sum(1 for r in roots for _ in r.parameters()):
            names: dict[int, str] = {}
            for r in roots:
                for n, p in r.named_parameters():
                    names.setdefault(id(p), n)
            self._names = names
        return self._names

    def context(self) -> RunContext:
        opt = self._primary
        hyper: dict[str, Any] = {}
        if opt is not None and opt.param_groups:
            g = opt.param_groups[0]
            hyper = {k: _plain(g[k]) for k in _HYPER if k in g}
        n = sum(p.numel() for p in self._opt_params(opt)) if opt is not None else None
        return RunContext(
            framework="torch",
            optimizer=type(opt).__name__ if opt is not None else None,
            hyper=hyper,
            clip_norm=self.clip_norm,
            num_params=n,
        )

    @staticmethod
    def _opt_params(opt: torch.optim.Optimizer | None) -> list[torch.Tensor]:
        if opt is None:
            return []
        return [p for g in opt.param_groups for p in g["params"]]

    # --- backward ------------------------------------------------------------------------------
    def before(
        self,
        kind: str,
        roots: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor | None],
        inputs: Sequence[torch.Tensor] | None,
    ) -> None:
        self.recorder.backward(kind, roots, grads, inputs)
        self.recorder.paused += 1
        self.recorder.tape_off()
        for r in roots:
            if isinstance(r, torch.Tensor):
                self._losses.append(r.detach())
        if self._primary is None and self._leaves is None and kind == "backward":
            self._leaves = list(inputs) if inputs else graph_leaves(roots)

    def after(
        self,
        kind: str,
        roots: Sequence[torch.Tensor],
        inputs: Sequence[torch.Tensor] | None,
        result: Any,
    ) -> None:
        self.recorder.paused -= 1
        if not self.recorder.paused and not self.modules.depth:
            self.recorder.tape_on()
        if kind != "backward":
            return
        self.backward_calls += 1
        if self._primary is not None:
            return
        # no optimizer (yet): backward() is the step marker; check the gradients now
        leaves = self._leaves or []
        chk = check_grads(leaves, self._losses)
        if not chk.finite:
            self._failure(chk, leaves, where="backward")
        self._record(chk, None)
        self._end_step()
        self._ended_by_backward = True

    # --- optimizer -----------------------------------------------------------------------------
    def _pre_step(
        self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if self.optimizer is not None and opt is not self.optimizer:
            return
        self.recorder.paused += 1
        self.recorder.tape_off()
        if self._primary is None:
            self._primary = opt
            if self._ended_by_backward:
                # the first step was counted at backward() before an optimizer was seen: this
                # optimizer step belongs to it
                self.step = max(0, self.step - 1)
                popped = self.history.pop()
                self._carry_loss = popped.loss if popped is not None else None
                for fn in self.on_step_end:
                    fn()
        self._ended_by_backward = False
        self.step_was_skipped = False
        if self._leaves is not None and self.optimizer is None:
            self._leaves = None
        params = self._opt_params(opt)
        if not any(p.grad is not None for p in params) and not self._losses:
            return  # a closure-based optimizer (LBFGS) computes its gradients inside step()
        chk = check_grads(params, self._losses)
        self._pending = chk
        if chk.finite:
            self.notfinite_count = 0
        else:
            self._failure(chk, params, where="step", opt=opt)

    def _post_step(
        self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if self.optimizer is not None and opt is not self.optimizer:
            return
        self.recorder.paused = max(0, self.recorder.paused - 1)
        if self._skipped_grads:
            for p, g in self._skipped_grads:  # give the user their gradients back
                p.grad = g
            self._skipped_grads = []
        if opt is self._primary:
            pchk = check_params(self._opt_params(opt))
            if not pchk.finite and self._last_params_finite and not self.step_was_skipped:
                self._last_params_finite = False
                self._optimizer_failure(opt, pchk)
            self._record(self._pending, pchk)
            self._end_step()
        else:
            self.recorder.new_step()
        if not self.recorder.paused and not self.modules.depth:
            self.recorder.tape_on()

    # --- bookkeeping -----------------------------------------------------------------------------
    def _record(self, g: NormCheck | None, p: NormCheck | None) -> None:
        lr = None
        if self._primary is not None and self._primary.param_groups:
            lr = _plain(self._primary.param_groups[0].get("lr"))
        loss = g.losses[0] if g is not None and g.losses else self._carry_loss
        self._carry_loss = None
        rec = StepRecord(
            step=self.step,
            loss=loss,
            grad_norm=g.norm if g is not None else None,
            param_norm=p.norm if p is not None else None,
            lr=lr if isinstance(lr, float) else None,
            finite=(g is None or g.finite) and (p is None or p.finite),
            skipped=self.step_was_skipped,
        )
        names = self._param_names()
        if g is not None and g.per_tensor:
            params = self._opt_params(self._primary) if self._primary else (self._leaves or [])
            rec.layer_grad_norms = {
                names.get(id(params[i]), f"param{i}"): v for i, v in zip(g.index, g.per_tensor)
                if i < len(params)
            }
        self.history.append(rec)

    def _end_step(self) -> None:
        self.step += 1
        self._losses = []
        self._pending = None
        self.recorder.new_step()
        for fn in self.on_step_end:
            fn()

    # --- failures ---------------------------------------------------------------------------------
    def _failure(
        self,
        chk: NormCheck,
        params: Sequence[torch.Tensor],
        where: str,
        opt: torch.optim.Optimizer | None = None,
    ) -> None:
        finding = None
        extra: dict[str, Any] = {}
        if self.replay_enabled and self.recorder.events:
            finding, extra = replay(
                self.recorder.events, model=self.model, modules=self.modules, step=self.step
            )
        if finding is None:
            finding = self._watch_finding(chk, params)
            if self.replay_enabled:
                finding.details.setdefault(
                    "note",
                    "the replay of this step did not reproduce the non-finite value; "
                    "run with nanguard.locate() / --trace for the exact op",
                )
        scale = extra.get("activation_scale") or []
        if scale:
            finding.details.setdefault("activation_scale", scale[:32])
        if not self.history.healthy():
            finding.details.setdefault("first_step", True)
        diag = diagnose(finding, self.history, self.context())
        self.findings.append((finding, diag))
        self._apply_policy(finding, diag, params)

    def _watch_finding(self, chk: NormCheck, params: Sequence[torch.Tensor]) -> Finding:
        names = self._param_names()
        bad = [params[i] for i in chk.bad if i < len(params)]
        if bad:
            g = bad[0].grad
            assert g is not None
            nan, pinf, ninf = counts(g)
            pnames = [names.get(id(p), "?") for p in bad]
            return Finding(
                phase="backward",
                op=None,
                module=pnames[0].rsplit(".", 1)[0] if "." in pnames[0] else "",
                step=self.step,
                dtype=str(g.dtype).replace("torch.", ""),
                shape=tuple(g.shape),
                nan=nan,
                posinf=pinf,
                neginf=ninf,
                reached="gradients",
                detected_by="watch",
                details={"gradients": pnames},
            )
        return Finding(
            phase="forward",
            op=None,
            step=self.step,
            reached="loss",
            detected_by="watch",
            details={"losses": [v if math.isfinite(v) else str(v) for v in chk.losses]},
        )

    def _optimizer_failure(self, opt: torch.optim.Optimizer, pchk: NormCheck) -> None:
        params = self._opt_params(opt)
        names = self._param_names()
        bad = [params[i] for i in pchk.bad if i < len(params)]
        pnames = [names.get(id(p), "?") for p in bad]
        first = bad[0] if bad else params[0]
        nan, pinf, ninf = counts(first)
        loc = user_frame(2)
        finding = Finding(
            phase="optimizer",
            op=f"{type(opt).__name__}.step",
            module=pnames[0].rsplit(".", 1)[0] if pnames and "." in pnames[0] else "",
            source=loc.short if loc else None,
            source_code=loc.code if loc else None,
            step=self.step,
            dtype=str(first.dtype).replace("torch.", ""),
            shape=tuple(first.shape),
            nan=nan,
            posinf=pinf,
            neginf=ninf,
            reached="parameters",
            detected_by="watch",
            details={
                "parameters": pnames,
                "grads_finite": self._pending is None or self._pending.finite,
                "state": _state_summary(opt, bad[:1]),
            },
        )
        diag = diagnose(finding, self.history, self.context())
        self.findings.append((finding, diag))
        if self.policy == "raise":
            raise NonFiniteError(finding, diag)

    def _apply_policy(
        self, finding: Finding, diag: Diagnosis, params: Sequence[torch.Tensor]
    ) -> None:
        if self.policy == "raise":
            raise NonFiniteError(finding, diag)
        # skip: hide the gradients from this step's update; the post-step hook restores them
        self.notfinite_count += 1
        self.total_notfinite += 1
        self.step_was_skipped = True
        self._skipped_grads = [(p, p.grad) for p in params]
        for p in params:
            p.grad = None
        if self.notfinite_count >= self.max_consecutive_skips:
            raise GiveUpError(
                finding,
                diag,
                reason=f"{self.notfinite_count} consecutive steps had non-finite values",
                attempts=[f"skipped {self.notfinite_count} steps"],
            )

    def report(self) -> str:
        """A plain-text summary: steps, skips and every finding with its diagnosis."""
        from ..core.render import format_finding

        head = (
            f"nanguard: {self.step} steps, {len(self.findings)} non-finite events, "
            f"{self.total_notfinite} skipped"
        )
        body = [format_finding(f, d) for f, d in self.findings]
        return "\n\n".join([head, *body])


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return float(v.item())
    if isinstance(v, tuple):
        return tuple(_plain(x) for x in v)
    return v


def _state_summary(opt: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in params:
        st = opt.state.get(p, {})
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 1:
                n, pi, ni = counts(v)
                out[k] = {
                    "nonfinite": n + pi + ni,
                    "zeros": int((v == 0).sum()),
                    "min": float(v.nan_to_num().min()),
                }
    return out


def attach(
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    policy: str = "raise",
    replay: bool = True,
    max_consecutive_skips: int = 10,
) -> Guard:
    """Guard an ordinary training loop; returns the :class:`Guard` handle.

    Nothing in the loop changes::

        guard = nanguard.attach(model, optimizer)           # or: with nanguard.attach(...) as g:
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()      # <- NonFiniteError here, before a bad update is applied

    At every ``optimizer.step()`` (or, without an optimizer, after every ``backward()``) one
    fused check looks at the loss and all gradients. When it sees a NaN/Inf, the step is replayed
    under the locator to find the op that made it, the cause is diagnosed from the run's history,
    and the ``policy`` decides: ``"raise"`` raises :class:`~nanguard.NonFiniteError`; ``"skip"``
    drops that update and carries on (giving up after ``max_consecutive_skips``).
    """
    return Guard(
        model,
        optimizer,
        policy=policy,
        replay=replay,
        max_consecutive_skips=max_consecutive_skips,
    ).install()
