"""nanguard's own tensor work (the watch tier's fused check) is not traced by its locator.

Under ``nanguard run --trace`` the guard's per-step check runs while the locator's dispatch mode
is active; its norms (which overflow float32 on finite, exploding gradients by design) are not
values of the user's program, so the locator passes their ops through untraced.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Untraced", "untraced"]

F = TypeVar("F", bound=Callable[..., Any])


class Untraced:
    """``Untraced.depth``: how many of nanguard's own sections are running now (read per op)."""

    depth = 0


def untraced(fn: F) -> F:
    """Run ``fn`` with the locator passing its ops through."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        Untraced.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            Untraced.depth -= 1

    return wrapper  # type: ignore[return-value]
