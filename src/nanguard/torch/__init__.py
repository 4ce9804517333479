"""PyTorch adapter: the locator, watch, replay and the guard handle."""

from .locator import Locator, locate

__all__ = ["Locator", "locate"]
