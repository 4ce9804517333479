"""What ``nanguard run`` shows and writes while the script runs: a live status line on a
terminal, and TensorBoard scalars with ``--tensorboard DIR``.

Both are *observers*: ``watch(session)`` when a framework adapter is installed (they hook the
guard's ``on_step_end``, which runs in the training thread after each step), ``close(log)`` once,
when the run ends and before the finding is printed.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol, TextIO

from ..core import config

__all__ = ["LiveStatus", "Observer", "TensorBoardObserver", "make_observers"]


class Observer(Protocol):
    def watch(self, session: Any) -> None: ...
    def close(self, log: Any) -> None: ...


class LiveStatus:
    """``nanguard ▸ step 1,234 · loss 0.531 · 0 skipped · 1 rollback · 12 s`` at the bottom of
    the terminal, redrawn at most 4 times a second, from the second ``delay`` on (short runs never
    show it). Only when ``stream`` is a terminal and ``NANGUARD_LIVE`` is not ``0``. The script's
    own output is printed above it (rich's ``Live`` redirects stdout and stderr while it shows)."""

    def __init__(self, stream: TextIO | None = None, delay: float = 2.0, interval: float = 0.25) -> None:
        self.stream = stream or sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)()) and \
            config.live()
        self.delay = delay
        self.interval = interval
        self._t0 = time.monotonic()
        self._last = 0.0
        self._live: Any = None

    def watch(self, session: Any) -> None:
        guard = getattr(session, "guard", None)
        if self.enabled and guard is not None and hasattr(guard, "on_step_end"):
            guard.on_step_end.append(lambda: self.tick(guard))

    @staticmethod
    def line(guard: Any, elapsed: float) -> str:
        """The status text for ``guard`` (its step, last loss, skips and rollbacks)."""
        recs = list(getattr(guard, "recoveries", []))
        rollbacks = sum(1 for r in recs if r.get("action") == "rollback")
        skips = sum(1 for r in recs if r.get("action") in ("skip", "drop_batch"))
        parts = [f"step {guard.step:,}"]
        hist = guard.history
        if len(hist) and hist[-1].loss is not None:
            parts.append(f"loss {hist[-1].loss:.4g}")
        parts += [f"{skips} skipped", f"{rollbacks} rollback{'s' if rollbacks != 1 else ''}",
                  f"{elapsed:.0f} s"]
        return "nanguard ▸ " + " · ".join(parts)

    def tick(self, guard: Any) -> None:
        now = time.monotonic()
        if now - self._t0 < self.delay or now - self._last < self.interval:
            return
        self._last = now
        from rich.text import Text

        text = Text(self.line(guard, now - self._t0), style="dim")
        if self._live is None:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(text, console=Console(file=self.stream), auto_refresh=False,
                              transient=True, redirect_stdout=True, redirect_stderr=True)
            self._live.start()
        self._live.update(text, refresh=True)

    def close(self, log: Any = None) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


class TensorBoardObserver:
    """``--tensorboard DIR``: per-step scalars as the run goes, findings and recoveries at its end."""

    def __init__(self, logdir: str) -> None:
        from .tensorboard import TensorBoardLogger

        self.logger = TensorBoardLogger(logdir)

    def watch(self, session: Any) -> None:
        guard = getattr(session, "guard", None)
        if guard is not None and hasattr(guard, "on_step_end"):
            self.logger.watch(guard)

    def close(self, log: Any) -> None:
        self.logger.close(log)


def make_observers(tensorboard_dir: str | None, live: bool | None) -> list[Observer]:
    """The observers a run asked for (``live=None``: on when stderr is a terminal)."""
    out: list[Observer] = []
    if live is not False:
        status = LiveStatus()
        if status.enabled:
            out.append(status)
    if tensorboard_dir:
        out.append(TensorBoardObserver(tensorboard_dir))
    return out
