"""An independent reference tracer for labelling the scenarios (it does not use nanguard).

    python benchmarks/trace_origin.py benchmarks/scenarios/unsafe_log_sigmoid_bce.py [args]

Runs the script under a plain ``TorchDispatchMode`` that checks every floating input and output
of every aten op and keeps the provenance of every non-finite tensor (held strongly, so that the
autograd engine cannot drop and re-wrap it):

* an op whose inputs are all finite and whose output is not is a NEW ORIGIN;
* an output computed from a non-finite input inherits the earliest origin among its inputs;
* a non-finite tensor that no traced op made (a batch, a loaded weight) is an external origin.

When a non-finite value reaches a sink — the root of ``backward()``, a parameter's ``.grad``
after ``backward()``, a parameter or the optimizer state after ``optimizer.step()`` — it prints
REACHED with the origin of that value and stops the script (exit status 3; set TRACE_STOP=0 to
keep going). Origins that reach nothing (a ``-inf`` mask) are printed but do not stop the run.
Ops named in $TRACE_IGNORE are not printed; $TRACE_MAX caps the printed lines. It is slow and
only meant as a second opinion when writing the ``# expect:`` labels.
"""

from __future__ import annotations

import itertools
import os
import runpy
import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

MAX_REPORTS = int(os.environ.get("TRACE_MAX", "12"))
STOP = os.environ.get("TRACE_STOP", "1") != "0"
_IGNORE = set(filter(None, os.environ.get("TRACE_IGNORE", "").split(",")))
# in-place ops that overwrite their first argument without reading it
_OVERWRITE = {"uniform_", "normal_", "fill_", "zero_", "copy_", "bernoulli_", "random_",
              "exponential_", "set_", "resize_", "resize_as_"}
_IDS = itertools.count(1)


@dataclass
class Origin:
    id: int
    kind: str  # "op", "external" or "parameter"
    op: str
    phase: str
    module: str | None
    grad_fn: str | None
    step: int
    detail: str


class _State:
    def __init__(self) -> None:
        self.step = 0
        self.in_optimizer = False
        self.stack: list[nn.Module] = []
        self.names: dict[int, str] = {}
        self.outers: weakref.WeakSet[nn.Module] = weakref.WeakSet()
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self.recs: dict[int, tuple[torch.Tensor, Origin]] = {}
        self.pending: list[tuple[list[torch.Tensor], str | None]] = []
        self.reports = 0
        self.reached = 0


S = _State()


class Stop(Exception):
    pass


def _say(line: str) -> None:
    S.reports += 1
    if S.reports <= MAX_REPORTS:
        print(f"[trace] {line}", file=sys.stderr)


def _describe(o: Origin) -> str:
    return (f"origin #{o.id} {o.kind} op={o.op} phase={o.phase} module={o.module!r} "
            f"grad_fn={o.grad_fn} made at step {o.step}")


def _path() -> str | None:
    if not S.stack:
        return None
    return S.names.get(id(S.stack[-1]), "?")


def _flush_pending() -> None:
    for outs, path in S.pending:
        for t in outs:
            gf = t.grad_fn
            if gf is not None and "trace_module" not in gf.metadata:
                gf.metadata["trace_module"] = path
    S.pending.clear()


def _pre(mod: nn.Module, args: Any) -> None:
    _flush_pending()
    if not S.stack:
        S.outers.add(mod)
        S.names = {id(m): n for n, m in mod.named_modules()}
    S.stack.append(mod)


def _post(mod: nn.Module, args: Any, out: Any) -> None:
    _flush_pending()
    if S.stack and S.stack[-1] is mod:
        S.stack.pop()


def _bad(t: Any) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and t.is_floating_point()
        and t.numel() > 0
        and t.device.type != "meta"
        and not bool(torch.isfinite(t).all())
    )


def _origin_of(t: torch.Tensor) -> Origin | None:
    rec = S.recs.get(id(t))
    return rec[1] if rec is not None and rec[0] is t else None


def _track(t: torch.Tensor, o: Origin) -> None:
    S.recs[id(t)] = (t, o)


def _untrack(t: torch.Tensor) -> None:
    rec = S.recs.get(id(t))
    if rec is not None and rec[0] is t:
        del S.recs[id(t)]


def _params() -> list[tuple[str, torch.Tensor]]:
    out: dict[int, tuple[str, torch.Tensor]] = {}
    for m in list(S.outers):
        for n, p in m.named_parameters():
            out.setdefault(id(p), (n, p))
    for opt in list(S.optimizers):
        for g in opt.param_groups:
            for i, p in enumerate(g["params"]):
                out.setdefault(id(p), (f"param[{i}]", p))
    return list(out.values())


def _reached(sink: str, t: torch.Tensor) -> None:
    o = _origin_of(t)
    what = _describe(o) if o is not None else "an untracked non-finite value"
    print(f"[trace] REACHED {sink} at step {S.step}: {what}", file=sys.stderr)
    S.reached += 1
    if STOP:
        raise Stop


class Tracer(TorchDispatchMode):
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = str(func)
        short = name.split(".")[1] if name.count(".") >= 2 else name
        if short.startswith(("empty", "new_empty")):
            return func(*args, **kwargs)
        if S.pending:
            _flush_pending()
        node = torch._C._current_autograd_node()
        phase = "backward" if node is not None else ("optimizer" if S.in_optimizer else "forward")
        module = _path() if node is None else node.metadata.get("trace_module", "?")
        flat_in = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if short in _OVERWRITE and args and isinstance(args[0], torch.Tensor):
            flat_in = [t for t in flat_in if t is not args[0]]
        in_origins: list[Origin] = []
        for t in flat_in:
            o = _origin_of(t)
            if o is None and _bad(t):
                kind = "parameter" if isinstance(t, nn.Parameter) else "external"
                o = Origin(next(_IDS), kind, "parameter" if kind == "parameter" else "input",
                           phase, module, None, S.step, f"{tuple(t.shape)} first read by {name}")
                _track(t, o)
                _say(f"non-finite {kind} enters: {_describe(o)} ({o.detail})")
            if o is not None:
                in_origins.append(o)
        out = func(*args, **kwargs)
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if node is None and torch.is_grad_enabled() and any(t.requires_grad for t in flat_in):
            S.pending.append((outs, module))
        for i, t in enumerate(outs):
            if not _bad(t):
                _untrack(t)
                continue
            if in_origins:
                _track(t, min(in_origins, key=lambda o: o.id))
                continue
            absmax = [f"{float(a.abs().max()):.4g}" for a in flat_in
                      if a.is_floating_point() and a.numel() and a.device.type != "meta"]
            o = Origin(next(_IDS), "op", name, phase, module,
                       node.name() if node is not None else None, S.step,
                       f"output {i} {tuple(t.shape)} {t.dtype}: nan={int(t.isnan().sum())} "
                       f"+inf={int((t == float('inf')).sum())} -inf={int((t == float('-inf')).sum())}"
                       f" from finite inputs with |max| {absmax}")
            _track(t, o)
            if name not in _IGNORE:
                _say(f"NEW {_describe(o)}: {o.detail}")
        return out


def _opt_pre(opt: Any, args: Any, kwargs: Any) -> None:
    S.optimizers.add(opt)
    S.in_optimizer = True


def _opt_post(opt: Any, args: Any, kwargs: Any) -> None:
    S.in_optimizer = False
    try:
        for g in opt.param_groups:
            for p in g["params"]:
                if _bad(p):
                    _reached("the weights (after optimizer.step)", p)
                for v in opt.state.get(p, {}).values():
                    if isinstance(v, torch.Tensor) and _bad(v):
                        _reached("the optimizer state (after optimizer.step)", v)
    finally:
        S.step += 1


def main() -> None:
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    nn.modules.module.register_module_forward_pre_hook(_pre)
    nn.modules.module.register_module_forward_hook(_post, always_call=True)
    register_optimizer_step_pre_hook(_opt_pre)
    register_optimizer_step_post_hook(_opt_post)
    orig_backward = torch.Tensor.backward

    def backward(self: torch.Tensor, *a: Any, **k: Any) -> Any:
        _flush_pending()
        if _bad(self):
            _reached("the loss (root of backward)", self)
        res = orig_backward(self, *a, **k)
        for n, p in _params():
            if p.grad is not None and _bad(p.grad):
                _reached(f"the gradient of {n}", p.grad)
        return res

    torch.Tensor.backward = backward  # type: ignore[method-assign]
    status = 0
    try:
        with Tracer():
            runpy.run_path(script, run_name="__main__")
    except Stop:
        status = 3
    print(f"[trace] done: {S.step} optimizer steps, {S.reached} sink(s) reached", file=sys.stderr)
    sys.exit(status)


if __name__ == "__main__":
    main()
