"""Warnings raised under nanguard's wrappers name the line ``python script.py`` would name."""

from __future__ import annotations

import sys
import warnings

import pytest

from nanguard.core import transparent as tp


def _library(stacklevel: int) -> None:
    warnings.warn("from the library", UserWarning, stacklevel=stacklevel)


@tp.transparent
def _wrapper(stacklevel: int) -> None:
    _library(stacklevel)


def test_a_transparent_wrapper_is_skipped_by_stacklevel() -> None:
    tp.install()
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            line = sys._getframe().f_lineno + 1
            _wrapper(2)  # stacklevel=2 names the caller of _library: this line, not _wrapper
            _wrapper(1)  # stacklevel=1 names _library itself, as without the wrapper
    finally:
        tp.uninstall()
    assert [(w.filename, w.lineno) for w in seen] == [
        (__file__, line), (__file__, _library.__code__.co_firstlineno + 1)]
    assert warnings.warn is not tp._warn  # uninstalled


def test_without_install_the_wrapper_is_named_as_python_names_it() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _wrapper(2)
    assert seen[0].lineno == _wrapper.__code__.co_firstlineno + 2  # the line inside _wrapper


def test_warnings_under_a_guard_name_the_users_line() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("GradScaler('cuda') warns only where CUDA is missing")
    from torch.utils.data import DataLoader, IterableDataset

    import nanguard

    model = torch.nn.Linear(2, 1)
    guard = nanguard.attach(model, torch.optim.SGD(model.parameters(), lr=0.1))

    class Three(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter([torch.zeros(2)] * 3)

        def __len__(self) -> int:
            return 1  # wrong: DataLoader.__next__ warns with stacklevel=2

    loader = DataLoader(Three(), batch_size=None)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            line = sys._getframe().f_lineno + 1
            torch.amp.GradScaler("cuda")  # "CUDA is not available. Disabling." (stacklevel=2)
            len(loader)
            for _x in loader:  # line + 2: the length warning
                pass
    finally:
        guard.detach()
    where = {(w.filename, w.lineno) for w in seen}
    assert (__file__, line) in where and (__file__, line + 2) in where, [
        (w.filename, w.lineno, str(w.message)[:50]) for w in seen]
    assert not any("_patches" in w.filename for w in seen)
