"""The subcommands' console helpers (they live in :mod:`nanguard.core.console`)."""

from __future__ import annotations

from ..core.console import make_console, print_finding, print_stop

__all__ = ["make_console", "print_finding", "print_stop"]
