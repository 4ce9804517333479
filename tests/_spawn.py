"""The one way a test starts a fresh process: the ``spawn`` fixture of ``conftest.py``.

Every test that uses the fixture, directly or through another fixture, is in the end-to-end tier
(``pytest -m slow``); ``conftest.pytest_collection_modifyitems`` marks it. Timeouts are hang
guards (:data:`HANG_S` for runs that take seconds), never a measure: nothing asserts a duration.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

#: a hang guard only: the runs take seconds
HANG_S = 600


class Spawn:
    """Starts fresh processes with their output captured as text and a hang-guard timeout.

    ``spawn.nanguard("run", "train.py", cwd=d)`` is ``python -m nanguard run train.py``,
    ``spawn.python("-c", code)`` is ``python -c code`` (this interpreter), ``spawn.run(argv)`` any
    other command; each returns the :class:`subprocess.CompletedProcess` and takes
    :func:`subprocess.run`'s keywords (``cwd``, ``env``, ``timeout``, ...).
    ``spawn.popen(...)`` starts ``python ...`` without waiting for it (to send it a signal); one
    still running at the end of the session is killed.
    """

    def __init__(self) -> None:
        self._started: list[subprocess.Popen[str]] = []

    def run(self, cmd: Sequence[str | os.PathLike[str]], *, timeout: float = HANG_S,
            **kwargs: Any) -> subprocess.CompletedProcess[str]:
        kwargs.setdefault("capture_output", True)
        return subprocess.run([os.fspath(c) for c in cmd], text=True, timeout=timeout, **kwargs)

    def python(self, *args: str | os.PathLike[str], timeout: float = HANG_S,
               **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.run([sys.executable, *args], timeout=timeout, **kwargs)

    def nanguard(self, *args: str | os.PathLike[str], timeout: float = HANG_S,
                 **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.python("-m", "nanguard", *args, timeout=timeout, **kwargs)

    def popen(self, *args: str | os.PathLike[str], **kwargs: Any) -> subprocess.Popen[str]:
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        proc = subprocess.Popen([sys.executable, *(os.fspath(a) for a in args)], text=True, **kwargs)
        self._started.append(proc)
        return proc

    def close(self) -> None:
        """Kill what :meth:`popen` started and is still running."""
        for proc in self._started:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        self._started.clear()
