"""``locate()`` with a diagnosis: the tracers raise at the origin op, before any history exists
to diagnose with; the public entry points add the diagnosis the finding alone allows, so
``err.diagnosis.cause`` works on every ``NonFiniteError`` they raise.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from .diagnosis import diagnose
from .errors import NonFiniteError

__all__ = ["with_diagnosis"]

T = TypeVar("T")


class _Diagnosing(contextlib.AbstractContextManager[Any]):
    """The context manager ``locate()`` returned, unchanged (its attributes — ``.step``,
    ``.findings`` — read through), except that a ``NonFiniteError`` leaving it has a diagnosis."""

    def __init__(self, cm: Any) -> None:
        self._cm = cm

    def __enter__(self) -> Any:
        return self._cm.__enter__()

    def __exit__(self, et: Any, ev: Any, tb: Any) -> Any:
        _diagnose(ev)
        try:
            return self._cm.__exit__(et, ev, tb)
        except NonFiniteError as err:  # raised at the block's end (a value no op used)
            _diagnose(err)
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cm, name)


def _diagnose(err: Any) -> None:
    if isinstance(err, NonFiniteError) and err.diagnosis is None:
        err.diagnosis = diagnose(err.finding)  # no history: from the finding alone


def with_diagnosis(locate: Callable[..., T]) -> Callable[..., T]:
    """``locate`` (a context-manager factory) whose ``NonFiniteError`` carries a diagnosis."""

    @functools.wraps(locate)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        return _Diagnosing(locate(*args, **kwargs))  # type: ignore[return-value]

    return wrapper
