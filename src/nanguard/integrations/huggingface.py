"""Hugging Face ``transformers``: ``Trainer(..., callbacks=[NanGuardCallback()])``.

Why a callback is needed: ``Trainer``'s ``logging_nan_inf_filter`` (on by default) replaces a NaN
or Inf loss in the logs with the average of the previous ones, while the optimizer step goes on
and writes the NaN gradients into the weights — the run looks healthy and is already dead.

``Trainer`` calls a plain ``optimizer.step()`` after ``backward()`` (and after its own gradient
clipping), so the callback attaches a :class:`nanguard.Guard` to the model and the real optimizer
inside accelerate's wrapper when training begins. At every optimizer step — before the update —
the guard checks the loss and all gradients at once; on a NaN/Inf it replays the step under the
locator (the op, module, source line, phase), diagnoses the cause, and keeps the update from
reaching the weights. Then, by ``policy``:

* ``"raise"`` (default): :class:`~nanguard.NonFiniteError` with the finding, raised from the
  optimizer step: ``trainer.train()`` ends with it and the weights stay finite;
* ``"stop"``: the update is dropped, the finding printed, and ``control.should_training_stop``
  ends training normally (``trainer.train()`` returns; the finding is in ``callback.findings``);
* ``"skip"`` / ``"recover"``: as :func:`nanguard.attach`.

The guard's own replay sees only positional arguments of the model's call, and ``Trainer`` calls
``model(**inputs)``: when it cannot name the op, the callback runs the step's last forward again
(its keyword arguments are kept by a forward pre-hook on the model, removed when training ends)
under :func:`nanguard.locate` and replaces the finding with the located one. With gradient
accumulation that is the last micro-batch of the step.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as exc:
    raise ImportError(
        "nanguard.integrations.huggingface needs transformers: pip install 'nanguard[hf]' "
        "(or: pip install transformers accelerate)"
    ) from exc

import torch

from ..core.config import POLICIES as CORE_POLICIES
from ..core.diagnosis import Diagnosis, diagnose
from ..core.errors import NonFiniteError
from ..core.finding import Finding
from ..core.history import History
from ..core.policy import check_policy
from ..torch._recorder import RngState
from ..torch.guard import Guard
from ..torch.locator import LocateOptions, locate
from ..torch.snapshot import floating_buffers
from ._common import RunRecord

__all__ = ["POLICIES", "NanGuardCallback"]

log = logging.getLogger("nanguard")

#: the core's policies, and ``"stop"``: drop the bad update, then end training normally
POLICIES = (*CORE_POLICIES, "stop")


class NanGuardCallback(TrainerCallback):
    """Catch the first NaN/Inf of a ``Trainer`` run at its origin, before it reaches the weights.

    Args:
        policy: ``"raise"``, ``"stop"``, ``"skip"`` or ``"recover"`` (see the module docs).
        report_path: write the HTML report there when training ends or stops.
        json_path: write the run log (schema 1) there.
        **guard_kwargs: passed to :class:`nanguard.Guard` (``snapshot_every``, ``lr_factor``,
            ``max_recoveries``, ``replay``, ...).

    Attributes: ``guard`` (while training), ``findings``, ``history``, ``recoveries``.
    """

    def __init__(
        self,
        policy: str = "raise",
        *,
        report_path: str | None = None,
        json_path: str | None = None,
        **guard_kwargs: Any,
    ) -> None:
        check_policy(policy, "NanGuardCallback(policy=...)", extra=("stop",))
        self.outputs = RunRecord(report_path=report_path, json_path=json_path)
        self.policy = policy
        self.guard_kwargs = guard_kwargs
        self.guard: Guard | None = None
        self.history = History()
        self.findings: list[tuple[Finding, Diagnosis]] = []
        self._recoveries: list[dict[str, Any]] = []
        self._seen = 0
        self._model: torch.nn.Module | None = None
        self._hook: Any = None
        self._last: tuple[tuple[Any, ...], dict[str, Any], RngState] | None = None

    @property
    def recoveries(self) -> list[dict[str, Any]]:
        return self.guard.recoveries if self.guard is not None else self._recoveries

    # --- Trainer events ---------------------------------------------------------------------------
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
        model: torch.nn.Module | None = None, optimizer: Any = None, **kwargs: Any,
    ) -> None:
        """Attach the guard to the model and the optimizer accelerate wraps."""
        inner = optimizer
        while isinstance(getattr(inner, "optimizer", None), torch.optim.Optimizer):
            inner = inner.optimizer  # accelerate's AcceleratedOptimizer wraps the real one
        if not isinstance(inner, torch.optim.Optimizer):
            inner = None  # the guard adopts the first optimizer that steps
        # "raise"/"stop" run the guard with "skip": the bad update is dropped before anything
        # is raised, so the weights stay finite even where the Trainer catches exceptions
        policy = "skip" if self.policy in ("raise", "stop") else self.policy
        self.guard = Guard(model, inner, policy=policy, **self.guard_kwargs).install()
        self.history = self.guard.history
        self.findings = self.guard.findings
        self._seen = 0
        self._model = model
        if model is not None:
            # Trainer calls model(**inputs): keep the last call's keyword arguments, so a step
            # the guard could not replay can be located again (see _relocate)
            self._hook = model.register_forward_pre_hook(self._capture, with_kwargs=True)

    def _capture(self, mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # the first call of each micro-batch is Trainer's (the guard's replay calls it again)
        if self._last is None and mod.training and torch.is_grad_enabled():
            self._last = (args, dict(kwargs), RngState.capture())

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._last = None

    def on_substep_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._last = None  # gradient accumulation: keep the step's last micro-batch

    def _relocate(self, finding: Finding) -> Finding | None:
        """Run the step's last forward again under :func:`nanguard.locate` (same inputs, RNG
        state and — the update was not applied — weights) and backward through its loss."""
        model, last = self._model, self._last
        if model is None or last is None:
            return None
        args, kwargs, rng = last
        bufs = floating_buffers([model])
        saved = [b.detach().clone() for b in bufs]
        now = RngState.capture()
        rng.restore()
        try:
            with torch.enable_grad(), locate(model, step=finding.step, options=LocateOptions(unused="ignore")):
                out = model(*args, **kwargs)
                loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
                if not isinstance(loss, torch.Tensor):
                    return None
                params = [p for p in model.parameters() if p.requires_grad]
                torch.autograd.grad(loss, params, allow_unused=True)
        except NonFiniteError as err:
            return err.finding
        except Exception:  # best effort: the guard's finding stands
            log.debug("nanguard: the forward run again under locate() failed", exc_info=True)
            return None
        finally:
            with torch.no_grad():
                for b, v in zip(bufs, saved):
                    b.copy_(v)
            now.restore()
        return None

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Right after the (guarded) step: raise or stop on a new finding."""
        g = self.guard
        if g is None or len(g.findings) == self._seen:
            return
        self._seen = len(g.findings)
        finding, diag = g.findings[-1]
        if finding.detected_by == "watch":
            located = self._relocate(finding)
            if located is not None:
                finding, diag = located, diagnose(located, g.history, g.context())
                g.findings[-1] = (finding, diag)
        if self.policy == "raise":
            self._finish("nonfinite")
            raise NonFiniteError(finding, diag)
        if self.policy == "stop":
            from ..core.console import make_console, print_finding

            print_finding(make_console(sys.stderr), finding, diag)
            control.should_training_stop = True

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.findings and self.policy == "stop":
            self._finish("nonfinite")
            return
        # the events, the back-off and the verdict, as nanguard run prints them at the end
        status = self.guard.training_ended() if self.guard is not None and _is_main_process() else (
            "recovered" if self.findings else "ok")
        self._finish(status)

    def _finish(self, status: str) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._last = None
        outcome = None
        if self.guard is not None:
            self._recoveries = list(self.guard.recoveries)
            outcome = self.guard.outcome
            self.guard.detach()
            self.guard = None
        if _is_main_process():
            self.outputs.write(status, self.history, self.findings, self.recoveries, outcome=outcome)


def _is_main_process() -> bool:
    d = torch.distributed
    return not (d.is_available() and d.is_initialized()) or d.get_rank() == 0
