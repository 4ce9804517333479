"""``locate()`` with a diagnosis: the tracers raise at the origin op, before any history exists
to diagnose with; the public entry points add the diagnosis the finding alone allows, so
``err.diagnosis.cause`` works on every ``NonFiniteError`` they raise.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .diagnosis import diagnose
from .errors import NonFiniteError

__all__ = ["with_diagnosis"]

T = TypeVar("T")


@contextlib.contextmanager
def _diagnosing(cm: contextlib.AbstractContextManager[T]) -> Iterator[T]:
    try:
        with cm as value:
            yield value
    except NonFiniteError as err:
        if err.diagnosis is None:
            err.diagnosis = diagnose(err.finding)  # no history: from the finding alone
        raise


def with_diagnosis(locate: Callable[..., contextlib.AbstractContextManager[T]]
                   ) -> Callable[..., contextlib.AbstractContextManager[T]]:
    """``locate`` (a context-manager factory) whose ``NonFiniteError`` carries a diagnosis."""

    @functools.wraps(locate)
    def wrapper(*args: Any, **kwargs: Any) -> contextlib.AbstractContextManager[T]:
        return _diagnosing(locate(*args, **kwargs))

    return wrapper
