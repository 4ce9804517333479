"""The locator: find the op that made the first non-finite value, with provenance.

:func:`locate` (and ``nanguard run --trace``) is a public context manager, :class:`Locator`, that
owns a private ``TorchDispatchMode`` (:mod:`._mode`) and a module tracker, as
``torch.utils.flop_counter.FlopCounterMode`` owns its mode; it is configured once by a frozen
:class:`LocateOptions`. While the block runs, the mode sees every aten op — forward, backward
(PyTorch's ReluGrad is ``aten.threshold_backward``) and the optimizer step — and asks of each
floating output whether it is finite. When it is not:

* if a non-finite input flowed into the op, the output *inherits* that input's origin;
* if all inputs were finite, this op is a new *origin* (its finding is filled in: op, phase,
  module, source line, autograd node, input statistics);
* a non-finite tensor that entered from outside (the batch, a weight) gets an origin of kind
  ``data`` or ``parameter``.

An origin is reported when its values *reach* something that matters — the root of a backward
pass (the loss), a gradient written to a leaf, a weight or optimizer state written in place — and
the finding names the origin whose values got there. An origin that an op made from finite inputs
is also reported when Python reads one of its values (``.item()``), and when the block ends with
one of its values unused (or dropped unused): it is a finding wherever its values go. What is let
be: values that every later use made finite again (a ``-inf`` causal mask through a softmax) and
deliberate constants (``masked_fill(mask, -inf)``, ``log`` of a 0/1 mask) that reach no sink.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ..core.finding import Finding
from ..core.source import skip_dir
from . import _autograd, _light_mode
from ._mode import LocatorMode
from ._modules import ModuleStack
from ._options import LocateOptions

__all__ = ["LocateOptions", "Locator", "graph_leaves", "locate"]

skip_dir(torch.__path__[0])
# the training loops that wrap a script's own (their batch moves, their backward() and step calls):
# the user's line is the one that called them; model code (transformers) stays where the op is
for _loop in ("accelerate", "lightning", "pytorch_lightning", "lightning_fabric"):
    try:
        _spec = importlib.util.find_spec(_loop)  # found, not imported
    except (ImportError, ValueError):
        _spec = None
    if _spec is not None and _spec.submodule_search_locations:
        skip_dir(next(iter(_spec.submodule_search_locations)))


class Locator:
    """Trace a block op by op; the context manager behind :func:`locate` and ``--trace``.

    ``options`` fixes what it does (:class:`LocateOptions`). ``modules``: a module stack that a
    guard already installed (``nanguard run --trace`` shares the guard's); by default the locator
    installs its own for the block. ``on_open(True/False)`` is told when values made from finite
    inputs start / stop lying unused (the run session checks the end of the script meanwhile).

    The findings are in :attr:`findings` (with ``on_sink="raise"`` the first is also raised as
    :class:`~nanguard.NonFiniteError`).
    """

    def __init__(
        self,
        model: nn.Module | None = None,
        *,
        options: LocateOptions | None = None,
        modules: ModuleStack | None = None,
        on_open: Callable[[bool], None] | None = None,
    ) -> None:
        self.options = options if options is not None else LocateOptions()
        self._owns_stack = modules is None
        self._stack = modules if modules is not None else ModuleStack(model)
        self._mode = LocatorMode(model, modules=self._stack, options=self.options, on_open=on_open)
        self._handles: list[Any] = []
        self._saved_hooks: tuple[Any, Any] | None = None

    @property
    def findings(self) -> list[Finding]:
        """What reached a sink (in order); empty when the block was healthy."""
        return self._mode.findings

    @property
    def step(self) -> int | None:
        return self._mode.step

    @property
    def has_unused(self) -> bool:
        """Do values an op made non-finite from finite inputs lie unused now?"""
        return bool(self._mode.prov.open)

    def judge_open(self, when: str) -> None:
        """Report now the values an op made non-finite from finite inputs that have reached no
        sink yet (``--trace`` under torchrun, at a step's check that every rank agreed failed:
        FSDP2's gradient reduce-scatter moves them out of the tracer's sight first)."""
        self._mode.flush()
        self._mode.settle(when)

    def reach_gradients(self, grads: Sequence[torch.Tensor]) -> None:
        """The step's gradients as the check read them (FSDP2's: the local shards its
        reduce-scatter wrote, which no backward of the tracer's sees as a graph leaf's): a
        non-finite one whose values a traced op made reaches the gradients now."""
        mode = self._mode
        with mode.own_ops():
            for g in grads:
                origin = mode.origin_of(g)
                if origin is not None and not bool(torch.isfinite(g).all()):
                    mode.reach(origin, "gradients")
                    return

    def __enter__(self) -> Locator:
        mode, stack = self._mode, self._stack
        self._saved_hooks = (stack.on_enter, stack.on_exit)
        stack.on_enter = mode.module_entered
        stack.on_exit = mode.tag_module_output
        if self._owns_stack:
            stack.install()
        self._handles = [
            _autograd.add_backward_listener(_LocateListener(mode)),
            _autograd.add_optimizer_listener(mode.optsteps.pre, mode.optsteps.post),
        ]
        _light_mode.watching(True)  # before the push: a light mode with torch.compile watched
        mode.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is None:
                self._mode.flush()
                self._mode.settle("when the locate() block ended")
        finally:
            self.close()

    def close(self) -> None:
        """Stop tracing (``__exit__`` without the end-of-block check; safe to call twice)."""
        if self._saved_hooks is None:
            return
        if _get_current_dispatch_mode() is self._mode:
            self._mode.__exit__(None, None, None)
        _light_mode.watching(False)
        for h in self._handles:
            h.remove()
        self._handles = []
        self._stack.on_enter, self._stack.on_exit = self._saved_hooks
        self._saved_hooks = None
        if self._owns_stack:
            self._stack.remove()

    def end_step(self, step: int) -> None:
        """A training step ended (``--trace``: the guard's counter is now ``step``); what the
        step before it made from finite inputs and left unused is reported now."""
        self._mode.end_step(step)

    def settle(self, when: str) -> None:
        """Report now what lies unused (the script ended: ``when`` says so in the finding)."""
        self._mode.settle(when)


class _LocateListener(_autograd.BackwardListener):
    """Around each backward pass: the loss is a sink before it, the gradients after it."""

    def __init__(self, loc: LocatorMode) -> None:
        self.loc = loc
        self.leaves: list[list[torch.Tensor]] = []

    def before(
        self,
        kind: str,
        roots: Sequence[torch.Tensor],
        grads: Sequence[torch.Tensor | None],
        inputs: Sequence[torch.Tensor] | None,
    ) -> None:
        self.loc.check_roots(roots)
        self.leaves.append(list(inputs) if inputs is not None else graph_leaves(roots))

    def after(
        self,
        kind: str,
        roots: Sequence[torch.Tensor],
        inputs: Sequence[torch.Tensor] | None,
        result: Any,
    ) -> None:
        leaves = self.leaves.pop() if self.leaves else []
        self.loc.after_backward(leaves)
        if kind == "grad":
            self.loc.check_grads(leaves, list(result) if result is not None else [])
        else:
            self.loc.check_grads(leaves)


def graph_leaves(roots: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The leaf tensors (weights) a backward pass from ``roots`` will write ``.grad`` into."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    stack = [r.grad_fn for r in roots if isinstance(r, torch.Tensor) and r.grad_fn is not None]
    for r in roots:
        if isinstance(r, torch.Tensor) and r.grad_fn is None and r.requires_grad:
            out.append(r)
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        var = getattr(fn, "variable", None)
        if isinstance(var, torch.Tensor):
            out.append(var)
            continue
        for nxt, _ in fn.next_functions:
            if nxt is not None:
                stack.append(nxt)
    return out


def locate(
    model: nn.Module | None = None, *, step: int | None = None, options: LocateOptions | None = None
) -> Locator:
    """Raise :class:`NonFiniteError` naming the op that made the first NaN/Inf that mattered.

    Wrap any code — forward, ``loss.backward()``, ``optimizer.step()``, a metric — in it::

        with nanguard.locate(model):
            loss = model(x).sum()
            loss.backward()

    Runs on every op inside the block (the *trace* tier: about as costly as
    ``torch.autograd.detect_anomaly``, but it checks forward, backward and the optimizer, for NaN
    and Inf). It raises when a non-finite value reaches the loss (``backward()`` is called on it),
    a gradient or a weight; and, for a value an op made from finite inputs (a ``log(0)``, a
    ``0/0``, an overflow), wherever it goes: when Python reads it (``.item()``) or when the block
    ends with it unused. A ``-inf`` mask that a softmax absorbs is no error, and neither is an
    explicit ``-inf``/``nan`` constant that reaches no sink. The error names the *origin*: the op
    that made non-finite values from finite inputs, whose values got there. ``model`` (optional)
    names modules relative to it; ``step`` is the step number findings carry; ``options`` the
    rest (:class:`LocateOptions`; ``options.step`` gives way to ``step``).
    """
    opts = options if options is not None else LocateOptions()
    if step is not None:
        opts = replace(opts, step=step)
    return Locator(model, options=opts)
