"""Find the user's line of code that ran an operation.

Walks the Python stack from the current frame outwards and returns the first frame that is not
inside a framework or nanguard itself. Adapters register the folders to skip.
"""

from __future__ import annotations

import linecache
import os
import sys
from types import CodeType, FrameType

__all__ = ["SourceLocation", "skip_dir", "user_frame"]

_SKIP: list[str] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep]
_SKIP_EXTRA = ("<frozen", "<string>")
_CWD = os.getcwd()


def skip_dir(path: str) -> None:
    """Treat frames whose file lies under ``path`` as library code (not the user's)."""
    p = os.path.abspath(path) + os.sep
    if p not in _SKIP:
        _SKIP.append(p)


class SourceLocation(tuple[str, int]):
    """``(filename, lineno)`` with the two renderings the reports use."""

    __slots__ = ()

    def __new__(cls, filename: str, lineno: int) -> SourceLocation:
        return super().__new__(cls, (filename, lineno))

    @property
    def filename(self) -> str:
        return str(self[0])

    @property
    def lineno(self) -> int:
        return int(self[1])

    @property
    def short(self) -> str:
        """``train.py:42`` (relative to the working directory when below it)."""
        fn = self.filename
        try:
            rel = os.path.relpath(fn, _CWD)
            if not rel.startswith(".."):
                fn = rel
        except ValueError:
            pass
        return f"{fn}:{self.lineno}"

    @property
    def code(self) -> str | None:
        line = linecache.getline(self.filename, self.lineno).strip()
        return line or None


_DEMOS = os.path.join(_SKIP[0], "demos") + os.sep


def _is_library(filename: str) -> bool:
    if filename.startswith(_SKIP_EXTRA):
        return True
    if filename.startswith(_DEMOS):
        return False  # the demos are user code, written to be copied
    return any(filename.startswith(p) for p in _SKIP)


def user_frame(depth: int = 1, stop: frozenset[CodeType] = frozenset()) -> SourceLocation | None:
    """The innermost frame outside torch/tensorflow/keras/nanguard, or ``None``.

    The walk ends (returning ``None``) at a frame running one of the ``stop`` code objects: a
    replay uses that to avoid blaming the line that started the replay.
    """
    f: FrameType | None = sys._getframe(depth)
    while f is not None:
        if f.f_code in stop:
            return None
        fn = f.f_code.co_filename
        if not _is_library(fn):
            return SourceLocation(fn, f.f_lineno)
        f = f.f_back
    return None
