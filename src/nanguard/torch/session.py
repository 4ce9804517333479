"""``nanguard run`` for PyTorch: one global guard for a script nanguard did not write.

Installed as soon as the script imports torch. It watches every optimizer (or, without one,
every ``backward()``), with the modules the script calls discovered as it runs. ``trace=True``
also keeps a locator on every op, for code that has no optimizer step to hook.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from ..core.diagnosis import diagnose
from ..core.errors import NonFiniteError
from ..core.session import GuardSession
from .guard import _SESSION, Guard
from .locator import Locator, _LocateListener
from .replay import replay

__all__ = ["TorchSession"]

log = logging.getLogger("nanguard")


class TorchSession(GuardSession):
    """The torch side of a ``nanguard run``: a global :class:`Guard`, optionally a tracer."""

    framework = "torch"

    def __init__(self, policy: str = "raise", trace: bool = False, **guard_kwargs: Any) -> None:
        self.guard = Guard(None, None, policy=policy, **guard_kwargs)
        self.trace = trace
        self._locator: Locator | None = None
        self._handles: list[Any] = []
        self.notes: list[str] = []

    # --- lifecycle ---------------------------------------------------------------------------
    def install(self) -> None:
        # torch warns that global module hooks fire once more for a torch.compile'd module;
        # they are nanguard's, not the script's, and nanguard expects that
        warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
        self.guard.install()
        _SESSION.append(self.guard)  # a script's own attach() adopts this guard
        if self.trace:
            from . import _autograd

            # the tracer sees every op itself: the step recorder would only add cost
            self.guard.recorder.resume_tape = False
            self.guard.recorder.tape_off()
            self.guard.replay_enabled = False
            loc = Locator(None, modules=self.guard.modules, on_sink="raise", detected_by="trace")
            self._locator = loc
            self.guard.modules.on_exit = loc.tag_module_output
            self._handles.append(_autograd.add_backward_listener(_LocateListener(loc)))
            self._handles.append(_autograd.add_optimizer_listener(loc.optimizer_pre, loc.optimizer_post))
            self.guard.on_step_end.append(self._sync_step)
            loc.__enter__()

    def uninstall(self) -> None:
        self.notes.extend(self.uninstall_notes())
        if self._locator is not None:
            from torch.utils._python_dispatch import _get_current_dispatch_mode

            if _get_current_dispatch_mode() is self._locator:
                self._locator.__exit__(None, None, None)
            self._locator = None
        for h in self._handles:
            h.remove()
        self._handles = []
        self.guard._adopted = 0
        self.guard.detach()

    def _sync_step(self) -> None:
        if self._locator is not None:
            self._locator.step = self.guard.step

    # --- results --------------------------------------------------------------------------------
    def uninstall_notes(self) -> list[str]:
        """Notes for the run log, gathered at the end (guarantee checks under NANGUARD_VERIFY)."""
        return self.verify_notes()

    def explain_crash(self, exc: BaseException) -> NonFiniteError | None:
        """The script raised something else: did a non-finite value cause it?

        Replays what the current step recorded so far; a NaN that made ``torch.multinomial``
        or a ``Categorical`` raise is reported before the script's own traceback.
        """
        rec = self.guard.recorder
        if not rec.events or self.trace:
            return None
        try:
            finding, extra = replay(rec.events, model=None, modules=self.guard.modules, step=self.guard.step)
        except Exception:  # the replay is a best effort here; the script's error stands
            log.debug("nanguard: the replay after the script's error failed", exc_info=True)
            return None
        if finding is None:
            return None
        if extra.get("activation_scale"):
            finding.details.setdefault("activation_scale", extra["activation_scale"][:32])
        diag = diagnose(finding, self.guard.history, self.guard.context())
        self.guard.findings.append((finding, diag))
        return NonFiniteError(finding, diag)
