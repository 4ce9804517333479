"""Which module is running: a stack kept by global forward hooks, named relative to the model.

Global hooks (``register_module_forward_pre_hook``) leave the user's module objects untouched, so a
model can still be pickled with ``torch.save(model)`` while nanguard is attached.
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module

from ..core.patches import PatchSet

__all__ = ["ModuleStack", "class_name", "module_names", "param_names"]

log = logging.getLogger("nanguard")

_compiling = torch.compiler.is_compiling

_NAMES: weakref.WeakKeyDictionary[nn.Module, dict[int, str]] = weakref.WeakKeyDictionary()


def _call_kwargs(mod: nn.Module) -> dict[str, Any]:
    """The keyword arguments of the module call that is running our global pre-hook.

    torch gives global forward pre-hooks only ``(module, args)``; ``model(**batch)`` — how every
    Hugging Face model is called — would lose its inputs. They are in the frame of
    ``Module._call_impl`` (its ``inner`` closure) that called the hook.
    """
    f: FrameType | None = sys._getframe(2)
    for _ in range(4):
        if f is None:
            break
        loc = f.f_locals
        kw = loc.get("kwargs")
        if isinstance(kw, dict) and (loc.get("self") is mod or f.f_code.co_name == "inner"):
            return dict(kw)
        f = f.f_back
    return {}


def class_name(mod: object) -> str:
    """The name of ``mod``'s class as the user wrote it: FSDP2's ``fully_shard`` swaps a module's
    class for ``FSDP<Name>(FSDPModule, <Name>)``."""
    cls = type(mod)
    if cls.__name__.startswith("FSDP") and any(b.__name__ == "FSDPModule" for b in cls.__bases__):
        user = [b for b in cls.__bases__ if b.__name__ != "FSDPModule"]
        if user:
            return user[0].__name__
    return cls.__name__


def unwrap(m: nn.Module) -> nn.Module:
    """The user's model inside DistributedDataParallel / DataParallel / torch.compile wrappers."""
    for _ in range(4):
        inner = getattr(m, "_orig_mod", None)
        if not isinstance(inner, nn.Module) and type(m).__name__ in (
            "DistributedDataParallel", "DataParallel"
        ):
            inner = getattr(m, "module", None)
        if not isinstance(inner, nn.Module):
            return m
        m = inner
    return m


def module_names(root: nn.Module) -> dict[int, str]:
    """``id(module) -> path`` for every submodule of ``root`` (``""`` for the root).

    Paths are relative to the user's model: ``fc1``, not ``module.fc1`` under DDP or
    ``_orig_mod.fc1`` under ``torch.compile``.
    """
    names = _NAMES.get(root)
    if names is None:
        names = {id(m): n for n, m in unwrap(root).named_modules(remove_duplicate=True)}
        names[id(root)] = ""
        _NAMES[root] = names
    return names


def storage_key(t: torch.Tensor) -> int:
    """Where ``t``'s memory starts: the same for a weight and every view of it (``W.t()``,
    ``W[0]``, a tied weight)."""
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:  # tensors without storage (subclasses, functional tensors)
        log.debug("nanguard: no storage for a %s", type(t).__name__, exc_info=True)
        return -1


def param_names(root: nn.Module) -> dict[int, str]:
    """``storage key -> qualified name`` of ``root``'s parameters and floating buffers."""
    out: dict[int, str] = {}
    root = unwrap(root)
    for n, p in root.named_parameters(remove_duplicate=True):
        if p.device.type != "meta" and p.numel():
            out.setdefault(storage_key(p), n)
    for n, b in root.named_buffers(remove_duplicate=True):
        if b is not None and b.is_floating_point() and b.device.type != "meta" and b.numel():
            out.setdefault(storage_key(b), n)
    return out


class ModuleStack:
    """The stack of modules whose ``forward`` is running, maintained by global hooks.

    ``on_root_enter(module, args, kwargs)`` / ``on_root_exit(module, output)`` are called for
    top-level module calls (the model, a loss module): the recorder uses them to capture what a
    replay needs.
    """

    def __init__(self, root: nn.Module | None = None) -> None:
        self.root = root
        self.roots_only = False  # installed as a root-call wrapper, not as global module hooks
        #: a forward that builds no graph need not be told (the recorder is disarmed: an RL
        #: rollout, an evaluation loop): such a call then costs one Python frame and a flag
        self.quiet = False
        self.stack: list[nn.Module] = []
        self.roots_seen: weakref.WeakSet[nn.Module] = weakref.WeakSet()
        self.on_root_enter: Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None] | None = None
        self.on_root_exit: Callable[[nn.Module, Any], None] | None = None
        self.on_enter: Callable[[nn.Module], None] | None = None
        self.on_exit: Callable[[nn.Module, Any], None] | None = None
        self._handles: list[Any] = []

    # --- installation ------------------------------------------------------------------------
    def install(self, roots_only: bool = False) -> None:
        """Global module hooks on every module call (what the locator needs to name modules), or
        with ``roots_only`` a wrapper of ``Module.__call__`` that tells only top-level calls (what
        the guard's recorder needs): every module call then keeps PyTorch's fast path without
        hooks, and a call outside a graph (``no_grad``) costs one Python frame."""
        if self._handles:
            return
        if roots_only:
            self.roots_only = True
            _ROOT_CALLS.add(self)
            self._handles = [_RootHandle(self)]
            return
        self.roots_only = False
        self._handles = [
            _module.register_module_forward_pre_hook(self._pre_hook),
            _module.register_module_forward_hook(self._post_hook, always_call=True),
        ]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.stack.clear()
        self.roots_only = False

    # --- hooks ---------------------------------------------------------------------------------
    def _pre_hook(self, mod: nn.Module, args: tuple[Any, ...]) -> None:
        if _compiling():
            return  # inside a torch.compile'd forward: traced as a no-op, no graph break
        if not self.stack:
            self.roots_seen.add(mod)
            if self.on_root_enter is not None:
                self.on_root_enter(mod, args, _call_kwargs(mod))
        self.stack.append(mod)
        if self.on_enter is not None:
            self.on_enter(mod)

    def _post_hook(self, mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if _compiling():
            return
        # pop up to and including ``mod`` (a forward that raised may have left entries behind)
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i] is mod:
                del self.stack[i:]
                break
        if self.on_exit is not None:
            self.on_exit(mod, output)
        if not self.stack and self.on_root_exit is not None:
            self.on_root_exit(mod, output)

    # --- naming --------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        return len(self.stack)

    def current(self) -> tuple[str | None, str | None]:
        """(path, class name) of the innermost running module; ``(None, None)`` outside modules."""
        if not self.stack:
            return None, None
        return self.path_of(self.stack[-1]), class_name(self.stack[-1])

    def path_of(self, mod: nn.Module) -> str:
        """Path of ``mod`` relative to the model (``encoder.layers.3.fc1``; ``""`` for the model).

        The model is the ``root`` given to the stack, else the outermost running module. A module
        that is not registered under it (one built inside ``forward``) is named after its nearest
        registered ancestor: ``block.<Linear>``.
        """
        bases = [b for b in (self.root, self.stack[0] if self.stack else None) if b is not None]
        for base in bases:
            name = module_names(base).get(id(mod))
            if name is not None:
                return name
        base = bases[-1] if bases else mod
        names = module_names(base)
        for anc in reversed(self.stack):
            if anc is mod:
                continue
            parent = names.get(id(anc))
            if parent is not None:
                return f"{parent}.<{class_name(mod)}>" if parent else f"<{class_name(mod)}>"
        return f"<{class_name(mod)}>"

    # --- top-level calls only (``install(roots_only=True)``) -----------------------------------
    def root_enter(self, mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.stack.append(mod)
        if torch.is_grad_enabled():
            self.roots_seen.add(mod)  # a model trained here (not one only evaluated)
        if self.on_root_enter is not None:
            self.on_root_enter(mod, args, kwargs)

    def root_exit(self, mod: nn.Module, output: Any) -> None:
        self.stack.clear()
        if self.on_root_exit is not None:
            self.on_root_exit(mod, output)


class _RootHandle:
    def __init__(self, stack: ModuleStack) -> None:
        self.stack = stack

    def remove(self) -> None:
        _ROOT_CALLS.remove(self.stack)


class _RootCalls:
    """``nn.Module.__call__``, wrapped (class level, torch's class) while a stack listens: a
    call made while no other module runs is a root call; calls inside it go straight on."""

    def __init__(self) -> None:
        self.stacks: list[ModuleStack] = []
        self.depth = 0
        self._orig: Callable[..., Any] | None = None
        self._patches = PatchSet("the module-call wrapper")
        self._patches.cache(_NAMES.clear)  # names go stale when a model is changed between runs

    def add(self, stack: ModuleStack) -> None:
        if not self.stacks:
            self._orig = self._patches.patch(nn.Module, "__call__", _root_call)
        self.stacks.append(stack)

    def remove(self, stack: ModuleStack) -> None:
        if stack in self.stacks:
            self.stacks.remove(stack)
        if not self.stacks and self._orig is not None:
            self._patches.restore()
            self._orig = None


_ROOT_CALLS = _RootCalls()


def _root_call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    rc = _ROOT_CALLS
    orig = rc._orig
    assert orig is not None
    if rc.depth or _compiling():
        return orig(self, *args, **kwargs)
    if not torch.is_grad_enabled() and all(s.quiet for s in rc.stacks):
        rc.depth = 1
        try:
            return orig(self, *args, **kwargs)
        finally:
            rc.depth = 0
    stacks = list(rc.stacks)
    for s in stacks:
        s.root_enter(self, args, kwargs)
    rc.depth = 1
    try:
        out = orig(self, *args, **kwargs)
    except BaseException:
        rc.depth = 0
        for s in stacks:  # as a global forward hook with always_call=True: told with no output
            s.root_exit(self, None)
        raise
    rc.depth = 0
    for s in stacks:
        s.root_exit(self, out)
    return out


def is_parameter_like(t: torch.Tensor) -> bool:
    return isinstance(t, nn.Parameter)
