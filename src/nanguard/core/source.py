"""Find the user's line of code that ran an operation.

Walks the Python stack from the current frame outwards and returns the first frame that is not
inside a framework or nanguard itself. Adapters register the folders to skip.
"""

from __future__ import annotations

import ast
import linecache
import os
import sys
from types import CodeType, FrameType

__all__ = ["SourceLocation", "assignment_chain", "skip_dir", "user_frame", "user_frames", "user_site"]

_SKIP: list[str] = [os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep]
_SKIP_EXTRA = ("<frozen", "<string>")
_CWD = os.getcwd()


def skip_dir(path: str) -> None:
    """Treat frames whose file lies under ``path`` as library code (not the user's)."""
    p = os.path.abspath(path) + os.sep
    if p not in _SKIP:
        _SKIP.append(p)
        _LIBRARY.clear()


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


_LIBRARY: dict[str, bool] = {}  # filename -> is library code (one string test per file, ever)


def _is_library(filename: str) -> bool:
    known = _LIBRARY.get(filename)
    if known is not None:
        return known
    if filename.startswith(_SKIP_EXTRA):
        lib = True
    elif filename.startswith(_DEMOS):
        lib = False  # the demos are user code, written to be copied
    else:
        lib = any(filename.startswith(p) for p in _SKIP)
    _LIBRARY[filename] = lib
    return lib


def user_frame(depth: int = 1, stop: frozenset[CodeType] = frozenset()) -> SourceLocation | None:
    """The innermost frame outside torch/tensorflow/keras/nanguard, or ``None``.

    The walk ends (returning ``None``) at a frame running one of the ``stop`` code objects: a
    replay uses that to avoid blaming the line that started the replay.
    """
    f: FrameType | None = sys._getframe(depth)
    lib = _LIBRARY
    while f is not None:
        code = f.f_code
        if stop and code in stop:
            return None
        fn = code.co_filename
        known = lib.get(fn)
        if known is None:
            known = _is_library(fn)
        if not known:
            return SourceLocation(fn, f.f_lineno)
        f = f.f_back
    return None


def user_site(depth: int = 1) -> tuple[SourceLocation, int] | None:
    """As :func:`user_frame`, with the frame's bytecode offset (``f_lasti``): two ops of one run
    of a line have rising offsets, the next run of the line (a loop) starts lower again."""
    f: FrameType | None = sys._getframe(depth)
    lib = _LIBRARY
    while f is not None:
        fn = f.f_code.co_filename
        known = lib.get(fn)
        if known is None:
            known = _is_library(fn)
        if not known:
            return SourceLocation(fn, f.f_lineno), f.f_lasti
        f = f.f_back
    return None


def user_frames(depth: int = 1) -> list[FrameType]:
    """Every frame of the user's code on the stack, innermost first (library frames skipped)."""
    out: list[FrameType] = []
    f: FrameType | None = sys._getframe(depth)
    while f is not None:
        if not _is_library(f.f_code.co_filename):
            out.append(f)
        f = f.f_back
    return out


def _scope(tree: ast.AST, line: int) -> ast.AST:
    """The innermost function (or the module) whose lines hold ``line``."""
    best: ast.AST = tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            end = getattr(node, "end_lineno", None) or node.lineno
            if node.lineno <= line <= end and node.lineno >= getattr(best, "lineno", 0):
                best = node
    return best


def _assigns(scope: ast.AST, name: str) -> list[ast.stmt]:
    """The statements of ``scope`` (not of functions nested in it) that bind ``name``."""
    out: list[ast.stmt] = []
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
                out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def assignment_chain(filename: str, line: int, name: str, limit: int = 4) -> list[tuple[int, str]]:
    """Where the local ``name`` got its value before ``line`` (a running frame's line): the last
    statement of the same function that bound it above ``line``, then, while that statement
    reads ``name`` itself (``x = (x - x.mean()) / x.std()``), the one before it. ``(line,
    code)``, latest first; empty when the source cannot be read. Read from the file's text only
    when a finding needs it (no cost while the script runs)."""
    text = "".join(linecache.getlines(filename))
    try:
        tree = ast.parse(text) if text else None
    except SyntaxError:
        tree = None
    if tree is None:
        return []
    stmts = sorted((s for s in _assigns(_scope(tree, line), name) if s.lineno < line),
                   key=lambda s: s.lineno)
    chain: list[tuple[int, str]] = []
    while stmts and len(chain) < limit:
        st = stmts.pop()
        chain.append((st.lineno, linecache.getline(filename, st.lineno).strip()))
        value = st.value if isinstance(st, (ast.Assign, ast.AugAssign, ast.AnnAssign)) else None
        reads = value is not None and any(isinstance(n, ast.Name) and n.id == name
                                          for n in ast.walk(value))
        if not reads and not isinstance(st, ast.AugAssign):
            break
    return chain
