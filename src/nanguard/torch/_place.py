"""Where an op runs: its phase, module, source line, and the names of the weights it touches.

The bottom layer of the locator's dispatch mode (:mod:`._mode`), consulted on every op it checks
and whenever a finding is made. Phase: ``backward`` while the autograd engine runs a node;
``forward`` inside a module or before a backward; ``optimizer`` inside ``Optimizer.step`` and,
after ``backward()``, for ops on weights or gradients (clipping, a hand-written update). Module
paths come from the module stack's global hooks; a backward op gets the module and source line
that its forward op stored in the autograd node's ``metadata``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from ..core.source import user_frame
from ._light_mode import LightMode
from ._modules import ModuleStack, class_name, param_names, storage_key
from ._options import LocateOptions
from ._provenance import IdMap
from ._stats import checkable, iter_tensors

__all__ = ["META_KEY", "Place", "custom_function", "flat"]

META_KEY = "nanguard"


def flat(obj: Any) -> list[torch.Tensor]:
    """Tensors in op arguments/outputs: a tensor, or a (nested) list/tuple/dict of them."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    out: list[torch.Tensor] = []
    if isinstance(obj, (list, tuple)):
        for o in obj:
            if isinstance(o, torch.Tensor):
                out.append(o)
            elif isinstance(o, (list, tuple, dict)):
                out.extend(flat(o))
    elif isinstance(obj, dict):
        for o in obj.values():
            out.extend(flat(o))
    return out


def custom_function(node: Any) -> str | None:
    """The class name of a user's ``torch.autograd.Function`` whose backward ``node`` runs, or
    ``None`` for PyTorch's own nodes."""
    cls = getattr(node, "_forward_cls", None) if node is not None else None
    return getattr(cls, "__name__", None) if isinstance(cls, type) else None


class Place(LightMode):
    """Phase, module, source line and weight names for the ops of one locator."""

    opts: LocateOptions

    def _init_place(self, model: nn.Module | None, modules: ModuleStack | None) -> None:
        self.model = model
        self.modules = modules if modules is not None else ModuleStack(model)
        self.from_weights = IdMap()  # unchecked output of a gather/embedding/cat -> weight name
        self._params: dict[int, str] = {}
        self._params_for: set[int] | None = None
        self.in_optimizer = 1 if self.opts.phase == "optimizer" else 0
        self.post_backward = False
        self._grad_ptrs: set[int] = set()
        self._pending: list[tuple[list[torch.Tensor], tuple[Any, ...]]] = []
        self._deferred_where: Any = None
        # the replay's recorded line of a tape op / of the call that fed the model
        self._source_override: Any = None
        self._call_source: Any = None
        self._busy = False  # nanguard's own ops (checks, statistics) are not traced

    @contextlib.contextmanager
    def own_ops(self) -> Iterator[None]:
        """Ops run by the locator itself outside ``__torch_dispatch__`` (the checks at a sink,
        statistics for a finding) pass through untraced: they are not the user's."""
        was, self._busy = self._busy, True
        try:
            yield
        finally:
            self._busy = was

    # --- naming of weights ----------------------------------------------------------------------
    def refresh_params(self) -> None:
        roots: list[nn.Module] = []
        if self.model is not None:
            roots.append(self.model)
        roots.extend(self.modules.roots_seen)
        key = {id(r) for r in roots}
        if key == self._params_for:
            return
        self._params_for = key
        self._params = {}
        for r in roots:
            for ptr, n in param_names(r).items():
                self._params.setdefault(ptr, n)

    def param_name(self, t: torch.Tensor) -> str | None:
        if not checkable(t):
            return None
        self.refresh_params()
        name = self._params.get(storage_key(t))
        if name is None and self.from_weights:
            name = self.from_weights.get(t)  # copied out of a weight by a gather/embedding/cat
        return name

    def note_copies(self, flat_args: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
        """An unchecked op (embedding lookup, gather, cat) copied out of a weight: remember which,
        so a non-finite value met later is classified as that weight's."""
        self.refresh_params()
        if not self._params:
            return
        for a in flat_args:
            if not checkable(a):
                continue
            wname = self._params.get(storage_key(a))
            if wname is None and self.from_weights:
                wname = self.from_weights.get(a)
            if wname is not None:
                for t in outs:
                    self.from_weights[t] = wname
                return

    # --- phase -------------------------------------------------------------------------------------
    def _phase(self, args: Any = ()) -> tuple[str, Any]:
        node = torch._C._current_autograd_node()
        if node is not None:
            return "backward", node
        if self.modules.depth:
            return "forward", None
        if self.in_optimizer:
            return "optimizer", None
        if self.post_backward and self._touches_weights(args):
            # after backward(): clipping, a hand-written update — ops on weights or gradients
            return "optimizer", None
        return "forward", None

    def _touches_weights(self, args: Any) -> bool:
        is_grad = self.opts.is_grad
        for t in iter_tensors(args):
            if not checkable(t):
                continue
            if self.param_name(t) is not None or (is_grad is not None and is_grad(t)):
                return True
            if self._grad_ptrs and t.data_ptr() in self._grad_ptrs:
                return True
        return False

    def after_backward(self, leaves: Sequence[torch.Tensor]) -> None:
        """A backward pass returned: ops on weights or gradients from now on are the optimizer
        phase (clipping, a hand-written update) until the next forward pass."""
        self.post_backward = True
        self._grad_ptrs = {
            leaf.grad.data_ptr() for leaf in leaves if leaf.grad is not None and checkable(leaf.grad)
        }

    def module_entered(self, mod: nn.Module) -> None:
        """A module's ``forward`` starts: a new forward pass, whatever the previous ops were."""
        self.post_backward = False

    # --- location ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def running(self, source: Any = None, call: Any = None) -> Iterator[None]:
        """The replay re-runs a recorded op (``source``: its recorded line) or a recorded call of
        the model (``call``: the line that made it)."""
        saved = self._source_override, self._call_source
        self._source_override = source if source is not None else saved[0]
        self._call_source = call if call is not None else saved[1]
        try:
            yield
        finally:
            self._source_override, self._call_source = saved

    def _location(self, phase: str, node: Any) -> tuple[str | None, str | None, str | None, str | None]:
        """(module path, module type, source "file:line", code line)."""
        if phase == "backward":
            meta = node.metadata.get(META_KEY) if node is not None else None
            path, typ, loc = meta if meta is not None else (None, None, None)
            if custom_function(node) is not None:
                # a hand-written ``backward`` is user code: the line running now is the one to fix
                loc = self._where()[2] or loc  # as captured when the op ran (deferred checks)
            return path, typ, (loc.short if loc else None), (loc.code if loc else None)
        path, typ, loc = self._where()
        return path, typ, (loc.short if loc else None), (loc.code if loc else None)

    def _where(self) -> tuple[str | None, str | None, Any]:
        """(module path, module type, SourceLocation) of the op running now — cheap: the text
        of the source line is only read when a finding needs it."""
        if self._deferred_where is not None:
            return self._deferred_where
        path, typ = self.modules.current()
        loc = self._source_override
        if loc is None:
            loc = user_frame(2, self.opts.frame_stop) or self._call_source
        return path, typ, loc

    def _outside_source(self) -> Any:
        """The line a tensor that entered from outside came in at."""
        return self._source_override or self._call_source or user_frame(2, self.opts.frame_stop)

    def tag_module_output(self, mod: nn.Module, output: Any) -> None:
        """When a module's ``forward`` returns (a module hook): name the module on the autograd
        nodes of its outputs that no op tagged — a custom ``torch.autograd.Function`` runs its
        ops with grad mode off, so its node is made by ``apply``, after them."""
        if self._pending:
            self._flush_pending()
        loc = None
        for t in flat(output):
            gf = t.grad_fn if isinstance(t, torch.Tensor) else None
            md: dict[str, Any] | None = gf.metadata if gf is not None else None  # type: ignore[assignment]
            if md is None or META_KEY in md:
                continue
            if loc is None:
                loc = user_frame(2, self.opts.frame_stop) or self._call_source
            md[META_KEY] = (self.modules.path_of(mod), class_name(mod), loc)

    def _flush_pending(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for outs, meta in pending:
            for t in outs:
                gf = t.grad_fn
                if gf is not None:
                    md: dict[str, Any] = gf.metadata  # type: ignore[assignment]
                    if META_KEY not in md:
                        md[META_KEY] = meta
                    break
