"""Run a check when the script's top-level code ends, inside it (``nanguard run``).

``nanguard run`` executes the script with ``runpy``; an error raised while the script's module
frame returns propagates out of it as if the script's last line had raised it, so the run ends
with the script's own exit status for that error. The check is a local trace function on that
one frame, armed only while there is something to check (tracing costs every Python call while
the global trace function is set): a session arms it when its locator holds values to judge and
disarms it when they are settled. It does nothing when a debugger or coverage tool traces already,
off the main thread, or for a script that ends with an error of its own (``sys.exit(0)`` is the
script ending well).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["ScriptEnd"]


def _no_trace(frame: FrameType, event: str, arg: Any) -> None:
    return None  # new frames are not traced; only the script's module frame has a local tracer


class ScriptEnd:
    """``check()`` runs when the top-level code of ``script`` returns (or exits with status 0)."""

    def __init__(self, check: Callable[[], None], script: str | None = None) -> None:
        self._check = check
        self._script = script
        self._frame: FrameType | None = None
        self._armed = False
        self._exc: tuple[int, BaseException] | None = None

    def _module_frame(self) -> FrameType | None:
        if self._frame is not None:
            return self._frame
        f: FrameType | None = sys._getframe(1)
        found: FrameType | None = None
        while f is not None:
            if f.f_code.co_name == "<module>" and f.f_globals.get("__name__") == "__main__":
                if self._script is None or f.f_code.co_filename == self._script:
                    found = f
                    break
                # ``python -m nanguard`` runs its own __main__ further out: the innermost wins
                found = found or f
            f = f.f_back
        self._frame = found
        return found

    def arm(self) -> bool:
        """Start watching the script's frame; ``False`` when that is not possible."""
        if self._armed:
            return True
        if threading.current_thread() is not threading.main_thread() or sys.gettrace() is not None:
            return False
        frame = self._module_frame()
        if frame is None:
            return False
        frame.f_trace = self._local
        frame.f_trace_lines = False
        sys.settrace(_no_trace)
        self._armed = True
        return True

    def disarm(self) -> None:
        if not self._armed:
            return
        self._armed = False
        if sys.gettrace() is _no_trace:
            sys.settrace(None)
        if self._frame is not None:
            self._frame.f_trace = None

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "exception":
            self._exc = (frame.f_lasti, arg[1])
        elif event == "return":
            exc = self._exc if self._exc is not None and self._exc[0] == frame.f_lasti else None
            self.disarm()
            ok_exit = isinstance(exc[1], SystemExit) and exc[1].code in (None, 0) if exc else True
            if ok_exit:
                self._check()
        return self._local
