"""PyTorch adapter: the locator, watch, replay and the guard handle."""

from .locator import LocateOptions, Locator, locate

__all__ = ["LocateOptions", "Locator", "locate"]
