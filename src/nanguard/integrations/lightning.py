"""PyTorch Lightning: ``Trainer(callbacks=[NanGuardCallback()])``.

Lightning runs the forward and backward pass as a *closure* inside ``optimizer.step()``, so the
check cannot sit at the optimizer's pre-step hook (the gradients are not there yet). It runs in
``on_before_optimizer_step`` instead — after the closure's backward (and, under ``16-mixed``,
after Lightning unscaled the gradients), **before** Lightning's own gradient clipping and before
the update:

* one fused check of the step's loss(es) and all gradients (``nanguard.torch.watch``); the step's
  scalars go to a :class:`~nanguard.core.history.History`;
* with ``torch.distributed``, one all-reduce so every rank takes the same decision;
* on a non-finite value: the step's ``training_step`` is run again on the same batch (each of its
  micro-batches under gradient accumulation), RNG state and (not yet updated) weights under
  :func:`nanguard.locate`, which names the op that made it;
  the core diagnoses the cause, and the policy acts: ``raise`` (the default) raises
  :class:`~nanguard.NonFiniteError` with the update not applied; ``skip`` drops the update;
  ``recover`` drops a poisoned batch, or rolls back to the last snapshot and backs off the
  learning rate / switches on clipping, as :func:`nanguard.attach` does.

Under ``16-mixed`` a non-finite gradient with a finite loss is the GradScaler's business (it skips
the step and lowers its scale): it is recorded, not reported. After the update
(``on_train_batch_end``) the weights are checked once more.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    try:
        import pytorch_lightning as pl  # type: ignore[no-redef]
    except ImportError as exc:
        raise ImportError(
            "nanguard.integrations.lightning needs PyTorch Lightning: "
            "pip install 'nanguard[lightning]' (or: pip install lightning)"
        ) from exc

from ..core.diagnosis import Diagnosis, RunContext
from ..core.errors import NonFiniteError
from ..core.finding import Finding
from ..core.handle import GuardHandle, GuardOptions
from ..core.history import History
from ..core.step import Reading, Stage, StepDriver
from ..torch import _dist
from ..torch._recorder import RngState
from ..torch._stats import finding_for
from ..torch.locator import LocateOptions, locate
from ..torch.replay import module_of
from ..torch.snapshot import Snapshotter, floating_buffers
from ..torch.watch import NormCheck, check_grads, check_params
from ._common import RunRecord

__all__ = ["NanGuardCallback"]

log = logging.getLogger("nanguard")


class NanGuardCallback(pl.Callback, GuardHandle):
    """Catch the first NaN/Inf of a Lightning run at its origin; stop, skip or recover.

    Args:
        policy: ``"raise"`` (stop with :class:`~nanguard.NonFiniteError`), ``"skip"`` (drop the
            update) or ``"recover"`` (see :func:`nanguard.attach`).
        report_path: write the HTML report there when fitting ends (or stops on a finding).
        json_path: write the run log (schema 1) there.
        locate: re-run a failing step under the locator to name the op (default on).
        snapshot_every, lr_factor, max_recoveries, recovery_window, max_consecutive_skips,
            on_unfixable: as for :func:`nanguard.attach`.

    Attributes: ``history``, ``findings`` (``(Finding, Diagnosis)`` pairs), ``recoveries``.
    """

    def __init__(
        self,
        policy: str = "raise",
        *,
        report_path: str | None = None,
        json_path: str | None = None,
        locate: bool = True,
        snapshot_every: int = 50,
        lr_factor: float = 0.5,
        max_recoveries: int = 5,
        recovery_window: int = 1000,
        max_consecutive_skips: int = 10,
        on_unfixable: str = "raise",
        history_size: int = 10_000,
    ) -> None:
        self.options = GuardOptions.checked(
            "NanGuardCallback", policy=policy, replay=locate, snapshot_every=snapshot_every,
            lr_factor=lr_factor, max_recoveries=max_recoveries, recovery_window=recovery_window,
            max_consecutive_skips=max_consecutive_skips, on_unfixable=on_unfixable, history_size=history_size,
        )
        super().__init__()
        self.outputs = RunRecord(report_path=report_path, json_path=json_path)
        self.locate = locate
        self.controller = self.options.controller()
        self.driver = StepDriver(self.controller)
        self.snapshots = Snapshotter(every=snapshot_every)
        # the batches of the current optimizer step (several under accumulate_grad_batches), each
        # with its index and the RNG state at its start: what a replay runs again
        self._micro: list[tuple[Any, int, RngState | None]] = []
        self._stepped = False
        self._losses: list[torch.Tensor] = []
        self._saved_lrs: list[tuple[dict[str, Any], Any]] = []
        self._names: list[str] = []
        # the optimizer step in progress: its port and reading (until its batch end records it)
        self._port: _LightningPort | None = None
        self._reading: Reading | None = None

    @property
    def steps(self) -> int:
        return len(self.history)

    @property
    def step(self) -> int:
        return self.driver.step

    @step.setter
    def step(self, value: int) -> None:
        self.driver.step = value

    # --- Lightning hooks, in the order they run ---------------------------------------------------
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._stepped:  # the first micro-batch of a new optimizer step
            self._micro, self._stepped = [], False
        rng = RngState.capture() if self.locate else None  # the replay draws the same dropout masks
        self._micro.append((batch, batch_idx, rng))
        del self._micro[:-_MAX_MICRO]

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        self._losses.append(loss.detach())

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        params = _params(optimizer)
        d = self.driver
        if d.stage is not Stage.ENDED:
            d.abandon()  # the last step's batch end never came (an exception Lightning handled)
        d.step = trainer.global_step
        d.begin()
        self._stepped = True
        chk = check_grads(params, self._losses)
        losses, self._losses = self._losses, []
        port = _LightningPort(self, params, optimizer, trainer, pl_module, chk)
        self._port, self._reading = port, self._read(chk, optimizer)
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        try:
            if not chk.finite and scaler is not None and losses and \
                    all(bool(torch.isfinite(x).all()) for x in losses):
                # 16-mixed: the loss scale overflowed; the scaler skips this step and lowers it
                if d.scaler_skipped(port, nan_loss=False, scale=_scale(scaler)):
                    self._end(finite=None)
                return
            d.check(chk.finite, port, checks_after=self.policy != "raise")
        except BaseException:
            port.skip_update()  # a raise must not apply it either
            self._end(finite=False)
            raise

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        for group, lr in self._saved_lrs:
            group["lr"] = lr  # a back-off is a factor applied at each step, never stored
        self._saved_lrs = []
        d, port = self.driver, self._port
        if d.stage is not Stage.CHECKED or port is None:
            return  # a micro-batch of gradient accumulation: no optimizer step yet
        if d.skipped:
            self._end(finite=False)
            return
        opts = trainer.optimizers
        params = [p for o in opts for p in _params(o)]
        pchk = check_params(params)
        if self._reading is not None:
            self._reading.param_norm = pchk.norm

        def finding() -> Finding:  # the update itself made the weights non-finite (Adam eps=0, ...)
            names = self._param_names(pl_module, params)
            bad = [names[i] for i in pchk.bad if i < len(names)]
            return finding_for(
                None, "optimizer", f"{type(opts[0]).__name__}.step",
                module=module_of(bad[0]) if bad else "", step=d.step, reached="parameters",
                detected_by="watch", rank=_dist.rank() if _dist.active() else None,
                details={"parameters": bad, "grads_finite": True},
            )

        port.params = params
        try:
            d.check_after(pchk.finite, port, finding)
        finally:
            self._end(finite=None if pchk.finite else False)

    def _end(self, finite: bool | None) -> None:
        """The step's record: into the history, with what the driver decided."""
        self.driver.end(self._reading, finite=finite)
        self._port = self._reading = None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            status = self.training_ended()  # the events and the verdict, as nanguard run prints them
            self.outputs.write(status, self.history, self.findings, self.recoveries, outcome=self.outcome)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if trainer.is_global_zero:
            status = "nonfinite" if isinstance(exception, NonFiniteError) else "error"
            self.outputs.write(status, self.history, self.findings, self.recoveries,
                               error=None if status == "nonfinite" else repr(exception))

    # --- the parts -----------------------------------------------------------------------------------
    def _read(self, chk: NormCheck, opt: torch.optim.Optimizer) -> Reading:
        lr = opt.param_groups[0].get("lr") if opt.param_groups else None
        lr = float(lr) * self.recovery_state.lr_scale if isinstance(lr, (int, float)) else None
        params = _params(opt)
        names = self._names if len(self._names) == len(params) else [f"param{i}" for i in range(len(params))]
        return Reading(
            finite=chk.finite,
            # the sum of the step's backward losses, as the torch guard records it (Lightning
            # divides each micro-batch's loss by accumulate_grad_batches before backward)
            loss=math.fsum(chk.losses) if chk.losses else None,
            grad_norm=chk.norm, lr=lr, opt_type=type(opt).__name__, num_params=sum(p.numel() for p in params),
            layer_values=list(chk.per_tensor) if chk.per_tensor else None,
            layer_names=[names[i] for i in chk.index] if chk.per_tensor else None,
        )

    def _param_names(self, pl_module: pl.LightningModule, params: Sequence[torch.Tensor]) -> list[str]:
        by_id = {id(p): n for n, p in pl_module.named_parameters()}
        return [by_id.get(id(p), f"param{i}") for i, p in enumerate(params)]

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.optimizers:
            self._names = self._param_names(pl_module, _params(trainer.optimizers[0]))

    def _context(self, trainer: pl.Trainer, opt: torch.optim.Optimizer) -> RunContext:
        g = opt.param_groups[0] if opt.param_groups else {}
        hyper: dict[str, Any] = {k: g[k] for k in ("lr", "eps", "momentum", "weight_decay", "betas")
                                 if k in g}
        if isinstance(hyper.get("lr"), (int, float)):
            hyper["lr"] = float(hyper["lr"]) * self.recovery_state.lr_scale
        clip = trainer.gradient_clip_val if trainer.gradient_clip_algorithm in (None, "norm") else None
        return RunContext(
            framework="torch", optimizer=type(opt).__name__, hyper=hyper,
            clip_norm=float(clip) if clip else self.recovery_state.clip_norm,
            num_params=sum(p.numel() for p in _params(opt)) or None,
        )

    def _locate(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, chk: NormCheck,
        params: Sequence[torch.Tensor], step: int,
    ) -> Finding:
        """Run this step's ``training_step`` again under the locator — on each of its batches in
        turn under ``accumulate_grad_batches``, until one names the origin (same batch, RNG state
        and weights; buffers and the RNG are restored afterwards, ``self.log`` is muted)."""
        finding: Finding | None = None
        # manual optimization steps the optimizer inside training_step: never run it twice
        if self.locate and self._micro and pl_module.automatic_optimization:
            for k, (batch, batch_idx, rng) in enumerate(self._micro):
                finding = self._replay(trainer, pl_module, params, step, batch, batch_idx, rng)
                if finding is not None:
                    if len(self._micro) > 1:
                        finding.details["micro_batch"] = f"{k + 1} of {len(self._micro)} (batch_idx {batch_idx})"
                    break
        if finding is None:
            names = self._param_names(pl_module, params)
            bad = [names[i] for i in chk.bad if i < len(names)]
            finding = finding_for(
                None, "backward" if bad else "forward", None,
                module=module_of(bad[0]) if bad else None,
                step=step, reached="gradients" if bad else "loss", detected_by="watch",
                details={"gradients": bad} if bad else {"losses": [str(x) for x in chk.losses]},
            )
            if self.locate:
                finding.details["note"] = ("the replay of this step did not reproduce the "
                                           "non-finite value")
        if _dist.active():
            finding.rank = _dist.rank()
        return finding

    def _replay(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, params: Sequence[torch.Tensor], step: int,
        batch: Any, batch_idx: int, rng: RngState | None,
    ) -> Finding | None:
        bufs = floating_buffers([pl_module])
        saved = [b.detach().clone() for b in bufs]
        rng_now = RngState.capture()
        muted = {name: pl_module.__dict__.get(name) for name in ("log", "log_dict")}
        for name in muted:
            setattr(pl_module, name, _mute)
        if rng is not None:
            rng.restore()
        ctx = getattr(trainer.precision_plugin, "train_step_context", None)
        try:
            with torch.enable_grad(), (ctx() if ctx else _null()), \
                    locate(pl_module, step=step, options=LocateOptions(unused="ignore")):
                out = pl_module.training_step(batch, batch_idx)
                loss = out.get("loss") if isinstance(out, Mapping) else out
                if not isinstance(loss, torch.Tensor):
                    return None
                wanted = [p for p in params if p.requires_grad]
                torch.autograd.grad(loss, wanted, allow_unused=True)
        except NonFiniteError as err:
            return err.finding
        except Exception:  # the replay is a best effort; the watch finding stands
            log.debug("nanguard: the replay of training_step failed", exc_info=True)
            return None
        finally:
            for name, value in muted.items():
                if value is None:
                    pl_module.__dict__.pop(name, None)
                else:
                    setattr(pl_module, name, value)
            with torch.no_grad():
                for b, v in zip(bufs, saved):
                    b.copy_(v)
            rng_now.restore()
        return None

    def _apply_backoff(self, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer) -> None:
        clip = self.recovery_state.clip_norm
        if clip is not None:  # before Lightning's own clipping, which still applies after
            torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], clip)
        scale = self.recovery_state.lr_scale
        if scale != 1.0:
            self._saved_lrs = [(g, g["lr"]) for g in opt.param_groups]
            for g in opt.param_groups:
                g["lr"] = g["lr"] * scale

    def _snapshot(self, step: int, pl_module: pl.LightningModule, opt: torch.optim.Optimizer,
                  trainer: pl.Trainer) -> None:
        self.snapshots.take(step, _params(opt), floating_buffers([pl_module]), [opt],
                            _schedulers(trainer, opt), [])


class _LightningPort:
    """The step driver's port for one Lightning optimizer step: the update is skipped by
    clearing the gradients (the optimizer then skips those weights); a rollback restores the
    snapshot; ranks agree with one all-reduce."""

    adaptive = False
    script_clip: float | None = None

    def __init__(self, cb: NanGuardCallback, params: Sequence[torch.Tensor], opt: torch.optim.Optimizer,
                 trainer: pl.Trainer, pl_module: pl.LightningModule, chk: NormCheck) -> None:
        self.cb, self.params, self.opt, self.trainer, self.pl_module = cb, list(params), opt, trainer, pl_module
        self.chk = chk
        eps = opt.param_groups[0].get("eps") if opt.param_groups else None
        self.eps = float(eps) if isinstance(eps, (int, float)) else None

    # --- what the driver asks ------------------------------------------------------------------
    def agree(self, ok: bool) -> tuple[bool, list[int]]:
        agreed, bad, _ = _dist.agree(ok, self.params)
        return agreed, bad

    def locate(self) -> Finding:
        return self.cb._locate(self.trainer, self.pl_module, self.chk, self.params, self.cb.driver.step)

    def history(self) -> History:
        return self.cb.history

    def context(self) -> RunContext:
        return self.cb._context(self.trainer, self.opt)

    def share(self, finding: Finding | None, diag: Diagnosis | None,
              bad_ranks: list[int]) -> tuple[Finding, Diagnosis]:
        if _dist.active():
            return _dist.share(finding, diag, bad_ranks)
        assert finding is not None and diag is not None
        return finding, diag

    def snapshot(self, before_update: bool) -> None:
        cb, step = self.cb, self.cb.driver.step
        if cb.policy == "raise":
            return
        if before_update and cb.snapshots.last is None:
            # skip needs one too: an update that itself makes the weights non-finite is undone
            cb._snapshot(step, self.pl_module, self.opt, self.trainer)
        elif not before_update and cb.snapshots.due(self.trainer.global_step):
            cb._snapshot(self.trainer.global_step, self.pl_module, self.trainer.optimizers[0], self.trainer)

    def apply_settings(self, lr_scale: float, clip_norm: float | None) -> None:
        self.cb._apply_backoff(self.params, self.opt)

    # --- the controller's Backend ---------------------------------------------------------------
    def skip_update(self) -> None:
        for p in self.params:
            p.grad = None

    def rollback(self, older: bool = False) -> int | None:
        snap = self.cb.snapshots.target(older)
        if snap is None:
            return None
        Snapshotter.restore(snap, self.params, floating_buffers([self.pl_module]), [self.opt],
                            _schedulers(self.trainer, self.opt), [])
        return int(snap.step)

    def trial(self, fixes: list[Any]) -> None:
        return None  # Lightning owns the step (its closure): a fix is judged by the outcome

    def across_ranks(self, values: tuple[float | None, ...]) -> list[tuple[float | None, ...]]:
        from ..torch import _dist  # strategy="ddp": its process group

        return _dist.gather(values)

    def settings_changed(self) -> None:
        return None

    def set_eps(self, eps: float) -> None:
        for g in self.opt.param_groups:
            if isinstance(g.get("eps"), (int, float)) and g["eps"] < 1e-12:
                g["eps"] = eps

    def restore_state(self) -> dict[str, Any]:
        return {}


def _scale(scaler: Any) -> float | None:
    try:
        return float(scaler.get_scale())
    except Exception:  # a scaler nanguard cannot read: its scale is unknown
        log.debug("nanguard: cannot read the loss scale", exc_info=True)
        return None


#: at most this many micro-batches of one optimizer step are kept for a replay
_MAX_MICRO = 64


def _params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    inner = getattr(opt, "optimizer", opt)  # Lightning's LightningOptimizer wraps the real one
    return [p for g in inner.param_groups for p in g["params"]]


def _schedulers(trainer: pl.Trainer, opt: torch.optim.Optimizer) -> list[Any]:
    out = []
    for cfg in getattr(trainer, "lr_scheduler_configs", []) or []:
        s = getattr(cfg, "scheduler", None)
        if s is not None and getattr(s, "optimizer", None) is getattr(opt, "optimizer", opt):
            out.append(s)
    return out


def _mute(*args: Any, **kwargs: Any) -> None:
    """``self.log`` while a step is replayed: the step was logged once already."""


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
