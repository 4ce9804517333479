"""The files ``nanguard run`` writes (``--json``, ``--report``): checked before the script
starts, written one independently of the other when it ends, and not lost to a second Ctrl-C.

A run can take hours: an output path that cannot be written or a missing matplotlib must stop
it at once (exit 2, the script never started), not be found at the end. A missing folder is
created then, and said so (``--json runs/exp1/log.json``). At the end each
output is written on its own — a full disk for the run log does not cost the report — and a
failure is one line that leaves the run's exit status as it was (0 becomes 2).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
from typing import Any

from .core.outfile import check_writable

__all__ = ["OutputShield", "check_outputs", "write_outputs"]

_REPORT_NEEDS = "--report needs matplotlib to draw its plots: pip install 'nanguard[report]' " \
    "(or: pip install matplotlib), or run without --report"


def check_outputs(json_path: str | None, report_path: str | None) -> list[str]:
    """What is wrong with the outputs a run asked for (empty: nothing), before it starts; the
    missing folders of the paths are created (and said so on stderr)."""
    problems = []
    for flag, path in (("--json", json_path), ("--report", report_path)):
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.lexists(folder):
            try:
                os.makedirs(folder)
                print(f"nanguard run: created the folder {folder} for {flag}", file=sys.stderr)
            except OSError as exc:
                problems.append(f"{flag} {path}: cannot create the folder {folder}: "
                                f"{exc.strerror or exc}")
                continue
        why = check_writable(path)
        if why:
            problems.append(f"{flag} {path}: {why}")
    if json_path and report_path and json_path == report_path:
        problems.append(f"--json and --report are both {json_path}: give them different paths")
    if report_path and not _installed("matplotlib"):
        problems.append(_REPORT_NEEDS)
    return problems


def _installed(name: str) -> bool:
    """Whether ``import name`` can work, without importing it (matplotlib takes a second)."""
    if name in sys.modules:
        return sys.modules[name] is not None  # None: import blocked
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def write_outputs(log: Any, json_path: str | None, report_path: str | None) -> list[str]:
    """Write the run log and the report, each on its own; returns one line per failure."""
    failures = []
    if json_path:
        try:
            log.write(json_path)
        except Exception as exc:
            failures.append(f"could not write the run log to {json_path}: {_why(exc)}")
    if report_path:
        try:
            from .core.report_html import write_report

            write_report(log, report_path)
        except Exception as exc:  # a full disk, or a plot matplotlib could not draw
            failures.append(f"could not write the report to {report_path}: {_why(exc)}")
    return failures


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f" ({exc.filename})" if exc.filename else "")
    return f"{type(exc).__name__}: {exc}"


class OutputShield:
    """While the run ends (the finding printed, the outputs written), Ctrl-C and SIGTERM no
    longer interrupt: they say what is being finished. :meth:`stop` puts the handlers back and
    returns the signal that came meanwhile, if one did. Only in the main thread (where signal
    handlers live); elsewhere it does nothing. Also a context manager."""

    def __init__(self) -> None:
        self.interrupted: int | None = None
        self._saved: dict[int, Any] = {}

    def start(self) -> OutputShield:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._saved[sig] = signal.getsignal(sig)
                signal.signal(sig, self._note)
        return self

    def stop(self) -> int | None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()
        return self.interrupted

    def __enter__(self) -> OutputShield:
        return self.start()

    def _note(self, signum: int, frame: Any) -> None:
        if self.interrupted is None:
            print("nanguard run: finishing the run log and the report first (a moment)",
                  file=sys.stderr, flush=True)
        self.interrupted = signum

    def __exit__(self, *exc: object) -> None:
        self.stop()
