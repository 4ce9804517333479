"""``nanguard env``: versions of everything that matters, for bug reports."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import sys
from typing import Any

from .._version import __version__


def add_parser(sub: Any) -> None:
    p = sub.add_parser("env", help="print versions (Python, torch, tensorflow, keras, CUDA) for bug reports")
    p.set_defaults(command="env")


def _version(dist: str) -> str:
    """The installed version, read from package metadata (no import: tensorflow takes seconds)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def collect() -> dict[str, str]:
    info = {
        "nanguard": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "numpy": _version("numpy"),
        "rich": _version("rich"),
        "torch": _version("torch"),
    }
    if info["torch"] != "not installed":
        import torch

        info["cuda"] = str(torch.version.cuda) if torch.cuda.is_available() else "not available"
        info["torch threads"] = str(torch.get_num_threads())
    tf = _version("tensorflow")
    info["tensorflow"] = tf if tf != "not installed" else _version("tensorflow-cpu")
    for dist in ("keras", "lightning", "transformers", "pyarrow", "matplotlib"):
        info[dist] = _version(dist)
    return info


def main(args: argparse.Namespace) -> int:
    for k, v in collect().items():
        print(f"{k + ':':<15} {v}")
    return 0
