"""``nanguard run`` for PyTorch: one global guard for a script nanguard did not write.

Installed as soon as the script imports torch. It watches every optimizer (or, without one,
every ``backward()``), with the modules the script calls discovered as it runs. ``trace=True``
also keeps a locator on every op, for code that has no optimizer step to hook: a value an op
makes non-finite from finite inputs is then a finding wherever it goes — checked at each step's
end, and when the script's top-level code ends (:mod:`nanguard.core.script_end`). A run that
ends without a step says so in its notes (and on stderr), with what would have watched it.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

from ..core import config
from ..core.diagnosis import diagnose
from ..core.errors import NonFiniteError
from ..core.ranks import say
from ..core.script_end import ScriptEnd
from ..core.session import GuardSession
from ._script_calls import FORWARD_ONLY_AFTER, ScriptCalls, ordinal
from .guard import _SESSION, Guard
from .locator import LocateOptions, Locator
from .replay import replay

__all__ = ["TorchSession"]

log = logging.getLogger("nanguard")


def _in_data_worker() -> bool:
    """Is this process a ``DataLoader`` worker?"""
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None


class TorchSession(GuardSession):
    """The torch side of a ``nanguard run``: a global :class:`Guard`, optionally a tracer."""

    framework = "torch"

    def __init__(self, policy: str = "raise", trace: bool = False, say_notes: bool = True,
                 **guard_kwargs: Any) -> None:
        self.guard = Guard(None, None, policy=policy, **guard_kwargs)
        self.trace = trace
        self.say_notes = say_notes  # print the end-of-run notes on stderr (not under nanguard check)
        self._locator: Locator | None = None
        self._script_end: ScriptEnd | None = None
        self.notes: list[str] = []
        #: until the first step ends: the script's torch calls per line (not under --trace)
        self.calls: ScriptCalls | None = None
        #: the op-by-op check started because no step came (a forward-only program)
        self.forward_traced = False

    # --- lifecycle ---------------------------------------------------------------------------
    def install(self) -> None:
        # torch warns that global module hooks fire once more for a torch.compile'd module;
        # they are nanguard's, not the script's, and nanguard expects that
        warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
        self.guard.install()
        _SESSION.append(self.guard)  # a script's own attach() adopts this guard
        self.guard.on_step_end.append(self._step_ended)
        if self.trace:
            # the tracer sees every op itself: the step recorder would only add cost
            self.guard.recorder.tape_off()
            self._start_tracing(pass_through=False)
        elif config.forward_check():
            self.calls = ScriptCalls(FORWARD_ONLY_AFTER, on_due=self._forward_only)
            self.guard.recorder.calls = self.calls

    def _start_tracing(self, pass_through: bool) -> None:
        """Every op checked from now on: at install under ``--trace``, or (``_forward_only``)
        inside the tape's dispatch of an op, when a script has run many torch calls and no step
        (``pass_through``: the tape, pushed, cannot be popped there; it passes ops through and
        counts their lines, and goes at the next model call or the step's end)."""
        g = self.guard
        g.recorder.resume_tape = False
        if pass_through:
            g.recorder.enabled = False
        g.replayer.enabled = False
        # the tracer names every module: global module hooks, not the guard's root calls
        g.modules.remove()
        g.modules.install()
        if self._script_end is None:
            self._script_end = ScriptEnd(self._script_ended, sys.argv[0] if sys.argv else None)
        calls = self.calls
        loc = Locator(None, modules=g.modules, on_open=self._unused_changed,
                      options=LocateOptions(on_sink="raise", detected_by="trace", defer_across_ranks=True,
                                            run_of=calls.describe if calls is not None else None))
        self._locator = loc
        g.replayer.live = loc  # under torchrun: what the tracer recorded, for the step's check
        loc.__enter__()

    def _stop_tracing(self) -> None:
        """The first step of a script checked op by op as forward-only ended: training has
        started, and the guard watches it as usual (called at the step's end, outside any op)."""
        g = self.guard
        g.recorder.tape_off()  # a tape pushed above the tracer: off the stack first
        if self._locator is not None:
            self._locator.close()
            self._locator = None
        g.recorder.tape_off()  # a tape pushed below the tracer's dispatch (on top now)
        if self._script_end is not None:
            self._script_end.disarm()
        g.modules.remove()
        g.modules.install(roots_only=True)
        # the tape comes back where it always does (after a backward(), the optimizer's post-step
        # hook, the next model call): pushed here, inside the step's end, it would stand above
        # the hazard look the step's end starts next, which then never starts
        g.replayer.enabled = g.recorder.enabled = g.recorder.resume_tape = True
        self.forward_traced = False

    def _forward_only(self) -> None:
        """:data:`FORWARD_ONLY_AFTER` torch calls and no ``backward()`` or optimizer step: a
        program that only computes forward (a numerical loop, an inference script) is checked
        op by op from here on, until a training step ends. Said once on stderr."""
        g = self.guard
        if g.training_started or self.trace or self._locator is not None:
            return
        if _in_data_worker():
            # a DataLoader worker (a forked copy of the run) never steps: its batches are the
            # data the main process's watch looks at; checking its ops would last all run
            self.calls = g.recorder.calls = None
            return
        why = self.calls.why() if self.calls is not None else "many torch calls"
        say(f"nanguard: {why} and no backward() or optimizer step yet: checking every op from "
            "here on, as --trace does, until a training step runs (NANGUARD_FORWARD_CHECK=0 "
            "turns this off)")
        self.forward_traced = True
        self._start_tracing(pass_through=True)

    def uninstall(self) -> None:
        notes = self.uninstall_notes()
        self.notes.extend(notes)
        for note in notes:
            if self.say_notes and not note.startswith("verify:"):
                say(f"nanguard: {note}")
        if self._script_end is not None:
            self._script_end.disarm()
        self.guard.recorder.tape_off()  # above the tracer when a forward-only check pushed it
        if self._locator is not None:
            self._locator.close()
            self._locator = None
        self.guard.detach(force=True)

    def _step_ended(self) -> None:
        """After each step's record: the tracer reports what the step left unused; after the
        first, the script's calls are no longer counted, and a forward-only check ends."""
        if self._locator is not None:
            self._locator.end_step(self.guard.step)
        if self.calls is not None:
            self.calls = self.guard.recorder.calls = None
        if self.forward_traced:
            self._stop_tracing()

    def _unused_changed(self, unused: bool) -> None:
        """The tracer holds values made non-finite from finite inputs that no op used (yet):
        check the end of the script meanwhile."""
        if self._script_end is None:
            return
        if unused:
            self._script_end.arm()
        else:
            self._script_end.disarm()

    def _script_ended(self) -> None:
        if self._locator is not None:
            self._locator.settle("when the script ended")

    # --- results --------------------------------------------------------------------------------
    def uninstall_notes(self) -> list[str]:
        """Notes for the run log, gathered when the script has ended: the guarantee check under
        ``NANGUARD_VERIFY``, a run that no step let nanguard watch, values the tracer could not
        judge (the last two are printed on stderr too)."""
        return self.verify_notes() + self._unwatched_note() + self._unjudged_note()

    def _unwatched_note(self) -> list[str]:
        g = self.guard
        if g.training_started or g.findings:
            return []
        if "nanguard.keras.session" in sys.modules:
            return []  # a Keras run with torch imported beside it: the Keras session speaks
        if self.trace:
            return ["no optimizer step and no backward() ran; --trace checked every op"]
        if self.forward_traced and self.calls is not None and self.calls.checked_from is not None:
            ops = self.calls.checked_from[2]
            return [f"no optimizer step and no backward() ran; every op from the {ordinal(ops)} "
                    "torch call on was checked (nanguard run --trace checks them all)"]
        return ["no optimizer step and no backward() ran: nothing was watched; "
                "--trace checks every op (nanguard run --trace ...)"]

    def _unjudged_note(self) -> list[str]:
        loc = self._locator
        if loc is None or not loc.has_unused or loc.findings or self.guard.findings:
            return []
        return ["--trace: values an op made non-finite from finite inputs were still unused when "
                "the script stopped, not judged (it ended with an error of its own, or under a "
                "debugger or coverage tracer)"]

    def complete(self, err: NonFiniteError) -> NonFiniteError:
        """As every session; a value made before any training step is named by the run of its
        line (``the 344th run of line 7``), not "step 0"."""
        g, f = self.guard, err.finding
        if not g.training_started and f.framework == "torch":
            f.details.setdefault("before_training", True)
            calls = self.calls
            if calls is not None:
                # the run is the one its origin was made in (stamped by the tracer then); a
                # finding the tracer did not make is not named by a run counted later
                unchecked = calls.unchecked_before()
                if unchecked:
                    f.details.setdefault("checked", unchecked)
        return super().complete(err)

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
