"""PyTorch adapter: the locator, watch, replay and the guard handle."""

from ..core.diagnosed import with_diagnosis
from .locator import LocateOptions, Locator
from .locator import locate as _locate

#: ``with nanguard.locate(model): ...`` — raise ``NonFiniteError`` (with its diagnosis) at the op
#: that made the first non-finite value
locate = with_diagnosis(_locate)

__all__ = ["LocateOptions", "Locator", "locate"]
