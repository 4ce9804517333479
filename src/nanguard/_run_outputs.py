"""The files ``nanguard run`` writes (``--json``, ``--report``): checked before the script
starts, written one independently of the other when it ends, and not lost to a second Ctrl-C.

A run can take hours: an output path that cannot be written or a missing matplotlib must stop
it at once (exit 2, the script never started), not be found at the end. A missing folder is
created then, and said so (``--json runs/exp1/log.json``). At the end each
output is written on its own — a full disk for the run log does not cost the report — and a
failure is one line that leaves the run's exit status as it was (0 becomes 2).

The run log is written first. After Ctrl-C or SIGTERM the report is written without its plots:
drawing them (matplotlib's import, five figures laid out) takes seconds that a user who pressed
Ctrl-C, or a scheduler about to kill the job, does not give; one line says how to draw them
from the run log, which is written beside the report when ``--json`` was not given.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .core.outfile import check_writable

__all__ = ["OutputShield", "Written", "check_outputs", "write_outputs"]

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


@dataclass
class Written:
    """What :func:`write_outputs` has to say: ``failures`` (a 0 exit status becomes 2) and
    ``notes`` (the status stays), one line each."""

    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def write_outputs(log: Any, json_path: str | None, report_path: str | None, *,
                  hurry: Callable[[], bool] | None = None) -> Written:
    """Write the run log, then the report, each on its own; called once, when the run ends.
    ``hurry`` is asked once the run log is written: when it says yes (the run was interrupted)
    a report that has plots to draw is written without them, and a note says how to draw them."""
    out = Written()
    runlog = json_path
    if json_path:
        try:
            log.write(json_path)
        except Exception as exc:
            out.failures.append(f"could not write the run log to {json_path}: {_why(exc)}")
            runlog = None
    if not report_path:
        return out
    try:
        from .core.report_html import needs_plots, write_report

        no_plots = None
        if hurry is not None and hurry() and needs_plots(log):
            no_plots = _plots_left_out(log, runlog, report_path, out)
        write_report(log, report_path, no_plots=no_plots)
    except Exception as exc:  # a full disk, or a plot matplotlib could not draw
        out.failures.append(f"could not write the report to {report_path}: {_why(exc)}")
    return out


def _plots_left_out(log: Any, runlog: str | None, report_path: str, out: Written) -> str:
    """The plots of an interrupted run's report are left out: the note on stderr (into ``out``)
    and the sentence that stands in their place in the report. Without ``--json`` the run log
    is written beside the report, for ``nanguard report`` to draw them later."""
    where = "the run log"
    if runlog is None:
        runlog = _spare_runlog(log, report_path, out)
        where = "the run log written beside it"
    later = (f"draw them from {where}: nanguard report {shlex.quote(runlog)} -o "
             f"{shlex.quote(report_path)}" if runlog else
             "no run log was kept to draw them from (nanguard run --json PATH keeps one)")
    out.notes.append(f"the report {report_path} has no plots: the run was interrupted, and "
                     f"drawing them takes seconds; {later}")
    return f"No plots: the run was interrupted, and drawing them takes seconds; {later}"


def _spare_runlog(log: Any, report_path: str, out: Written) -> str | None:
    """Write the run log beside the report (``report.html`` → ``report.json``) when no
    ``--json`` was given; a file there that is not a nanguard run log is kept, and said so."""
    stem, ext = os.path.splitext(report_path)
    path = stem + (".runlog.json" if ext == ".json" else ".json")  # never the report itself
    if os.path.lexists(path) and not _is_runlog(path):
        out.notes.append(f"{path} exists and is not a nanguard run log: it is kept, and the "
                         "run log was not written beside the report")
        return None
    try:
        log.write(path)
    except Exception as exc:
        out.failures.append(f"could not write the run log to {path}: {_why(exc)}")
        return None
    return path


def _is_runlog(path: str) -> bool:
    """Whether ``path`` holds a nanguard run log (an earlier run's, which may be replaced)."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "schema" in doc and "nanguard" in doc


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
