"""The script's own names for its optimizer and the model it updates, for suggested code.

Read once, when a finding is diagnosed (``run_context``): the frames of the user's code on the
stack (the training loop calling ``backward()`` or ``optimizer.step()`` and its callers) are
searched for the optimizer object itself and for an ``nn.Module`` whose parameters are exactly
the optimizer's, as a local, a global or an attribute of ``self``; the outermost frame that
holds one names it (where it was made, not a helper's parameter). A fix
then reads ``opt = torch.optim.SGD(net.parameters(), lr=0.001, momentum=0.9)`` in the script's
words; what is not found keeps the generic ``optimizer`` / ``model.parameters()``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ..core.source import user_frames

__all__ = ["script_names"]

log = logging.getLogger("nanguard")


def _candidates(scope: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """A frame's names, and one level into ``self`` (a trainer class, a LightningModule)."""
    yield from scope.items()
    me = scope.get("self")
    if me is not None and not isinstance(me, (torch.Tensor, type)):
        attrs = getattr(me, "__dict__", None)
        if isinstance(attrs, dict):
            yield from ((f"self.{k}", v) for k, v in attrs.items())
        if isinstance(me, nn.Module):
            yield from ((f"self.{k}", v) for k, v in me._modules.items())


def script_names(opt: torch.optim.Optimizer | None) -> dict[str, str]:
    """``{"optimizer": "opt", "params": "net.parameters()"}``: what the script calls ``opt``
    and the module it updates, where its frames say so (each key only when found; none when
    the frames cannot be read — the generic words are then said, never an error of ours)."""
    if opt is None:
        return {}
    try:
        return _names(opt)
    except Exception:
        log.debug("nanguard: reading the script's names failed", exc_info=True)
        return {}


def _names(opt: torch.optim.Optimizer) -> dict[str, str]:
    want = {id(p) for g in opt.param_groups for p in g["params"]}
    names: dict[str, str] = {}
    # the outermost frame that knows a name wins: where the optimizer was made (a module's
    # globals, a trainer's ``self``), not a helper's ``opt`` parameter
    for frame in user_frames(2):  # from the caller out (nanguard's own frames are skipped)
        found: dict[str, str] = {}
        scopes = [frame.f_locals] if frame.f_locals is frame.f_globals else [frame.f_locals, frame.f_globals]
        for scope in scopes:
            for name, v in _candidates(scope):
                if "optimizer" not in found and v is opt and _plain(name):
                    found["optimizer"] = name
                elif ("params" not in found and isinstance(v, nn.Module) and _plain(name)
                      and {id(p) for p in v.parameters()} == want):
                    found["params"] = f"{name}.parameters()"
        names.update(found)
    return names


def _plain(name: str) -> bool:
    """A name a line of Python can use (``self.opt`` too), not ``_`` or a dunder."""
    return all(part.isidentifier() for part in name.split(".")) and not name.startswith("_")
