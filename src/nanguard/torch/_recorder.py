"""The step recorder: what a replay needs to re-run the current step exactly.

While a guard is attached, every step is recorded as a short list of events:

* a **root call** — a top-level module call (the model, a loss module) with its arguments and the
  RNG state at its start (so dropout draws the same masks again);
* a **tape op** — an aten op run *outside* any module (the loss written by hand, a ``.float()`` on
  the batch, ``torch.log`` of the model's output), with its arguments and the user's source line;
  a ``torch.nn.functional`` loss called there is one tape op whose ``func`` is the Python function
  (:meth:`StepRecorder.record_call`, from its wrapper in ``_patches``), not its aten ops;
* a **backward** — the roots (the loss) and gradients of a backward pass.

Recording is cheap: top-level module calls are told by a wrapper of ``Module.__call__``
(``_modules._RootCalls``; the calls inside them keep PyTorch's fast path), and the tape's dispatch
mode is pushed only while no module is running (it is popped at each root call, during backward,
the optimizer step and data loading), so the ops inside the model cost nothing. Forwards that
build no graph are recorded once a step: from the second on (an RL rollout, an evaluation loop)
the recorder is disarmed — no tape, no record — until a forward with grad enabled.
Tensors made by earlier events are held weakly and recomputed in a replay; tensors that came from
outside (the batch, weights) are referenced as they are; an in-place op on such a tensor keeps a
copy of what it overwrote.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from ..core.source import SourceLocation, user_frame, user_site
from ..core.step import StepOrderError
from ._light_mode import LightMode
from ._modules import ModuleStack, storage_key
from ._script_calls import ScriptCalls

if TYPE_CHECKING:
    from ..core.finding import Finding

__all__ = ["LEAN_AFTER", "Backward", "Ref", "RootCall", "StepRecorder", "TapeOp", "carried_inputs"]

#: the forward with grad of one module (since the last ``backward()``, not fed by an earlier model
#: call of the step) from which a step goes lean: a rollout such as pytorch/examples'
#: ``reinforce.py`` calls its policy hundreds of times before its one ``backward()``; a GAN step,
#: two views of a contrastive batch, a triplet (anchor, positive, negative) or an ensemble (one
#: call per module) stay below; 4 and not 8: the ops of each recorded call cost ~2.5 % of that
#: rollout's update (``benchmarks/overhead.py --rl-only``: 1.06x at 4, 1.11x at 8)
LEAN_AFTER = 4

_RANDOM_WORDS = ("rand", "normal", "bernoulli", "dropout", "multinomial", "uniform", "exponential",
                 "cauchy", "geometric", "poisson", "random")


class Ref:
    """A tensor made by an earlier event: ``(event index, output index)``. Immutable by
    convention; a plain slotted class, since one is made per output of every op on the tape
    (a frozen dataclass's ``__init__`` costs ~1 µs more)."""

    __slots__ = ("event", "out")

    def __init__(self, event: int, out: int) -> None:
        self.event = event
        self.out = out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ref) and self.event == other.event and self.out == other.out

    def __hash__(self) -> int:
        return hash((self.event, self.out))

    def __repr__(self) -> str:
        return f"Ref(event={self.event}, out={self.out})"


@dataclass
class RngState:
    cpu: torch.Tensor
    cuda: list[torch.Tensor] | None = None

    @classmethod
    def capture(cls) -> RngState:
        cuda = None
        if torch.cuda.is_initialized():  # implies available; ~0.1 µs where is_available() is ~2
            cuda = torch.cuda.get_rng_state_all()
        return cls(torch.get_rng_state(), cuda)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


@dataclass
class TapeOp:
    func: Any
    args: Any
    kwargs: Any
    grad_enabled: bool
    source: SourceLocation | None
    rng: RngState | None = None
    n_out: int = 0
    generator: tuple[torch.Generator, torch.Tensor] | None = None  # a user Generator and its state
    # the last step's own update, written by hand after its backward() (``W -= lr * W.grad``): its
    # effect is in the weights this step used, and its inputs (the gradients) have changed since,
    # so a replay must not run it again; these are the tensors it wrote
    prelude: list[torch.Tensor] | None = None


@dataclass
class RootCall:
    module: nn.Module
    args: Any
    kwargs: Any
    grad_enabled: bool
    source: SourceLocation | None
    rng: RngState
    n_out: int = 0
    autocast: tuple[tuple[str, torch.dtype], ...] = ()  # (device type, dtype) of each autocast on


@dataclass
class Backward:
    kind: str
    roots: Any
    grads: Any
    inputs: Any
    source: SourceLocation | None


Event = TapeOp | RootCall | Backward


#: containers :meth:`StepRecorder._spec` looks into
_NESTED = (list, tuple, dict)


class MadeRefs:
    """tensor -> :class:`Ref` of the event that made it, holding the tensor weakly.

    Keyed by ``id`` with a weak reference beside it (an ``id`` reused by a new tensor after the
    old one died finds a dead reference: a miss): about a tenth of the cost of
    ``WeakIdKeyDictionary``, whose every lookup builds a ``WeakIdRef`` — read per argument of
    every op on the tape, every step. Made anew each step."""

    __slots__ = ("_d",)

    def __init__(self) -> None:
        self._d: dict[int, tuple[weakref.ref[torch.Tensor], Ref]] = {}

    def get(self, t: torch.Tensor) -> Ref | None:
        e = self._d.get(id(t))
        return e[1] if e is not None and e[0]() is t else None

    def __setitem__(self, t: torch.Tensor, ref: Ref) -> None:
        self._d[id(t)] = (weakref.ref(t), ref)


def _carry_key(t: torch.Tensor) -> tuple[int, tuple[int, ...], torch.dtype]:
    return storage_key(t), tuple(t.shape), t.dtype


def carried_inputs(rec: StepRecorder) -> list[torch.Tensor]:
    """The tensors this step's model calls (or the ops before them: ``hidden.detach()``)
    received that a model call of the previous step returned (an RNN's ``hidden``, passed back
    in)."""
    if not rec.prev_outputs:
        return []
    out = []
    for ev in rec.events:
        if isinstance(ev, (RootCall, TapeOp)):
            out += [t for t in _flat((ev.args, ev.kwargs))
                    if isinstance(t, torch.Tensor) and t.is_floating_point()
                    and _carry_key(t) in rec.prev_outputs]
    return out


def _flat_refs(obj: Any) -> list[Ref]:
    """The :class:`Ref` s inside a recorded argument structure."""
    if isinstance(obj, Ref):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [r for o in obj if isinstance(o, (Ref, list, tuple, dict)) for r in _flat_refs(o)]
    return []


def _flat(obj: Any) -> list[torch.Tensor]:
    """Tensors in a module's inputs or outputs: nested lists, tuples, dicts and dataclasses
    (a model returning ``Output(loss=..., logits=...)``), in a fixed order."""
    if isinstance(obj, torch.Tensor):  # the usual op output: no walk
        return [obj]
    out: list[torch.Tensor] = []

    def rec(o: Any, depth: int) -> None:
        if isinstance(o, torch.Tensor):
            out.append(o)
        elif depth > 8:
            return
        elif isinstance(o, (list, tuple)):
            for v in o:
                rec(v, depth + 1)
        elif isinstance(o, dict):
            for v in o.values():
                rec(v, depth + 1)
        elif dataclasses.is_dataclass(o) and not isinstance(o, type):
            for f in dataclasses.fields(o):
                rec(getattr(o, f.name, None), depth + 1)

    rec(obj, 0)
    return out


class _Tape(LightMode):
    """Records ops run outside any module (pushed only while no module is running). A
    :class:`~nanguard.torch._light_mode.LightMode`: not wrapped against dynamo in a script that
    compiles nothing."""

    def __init__(self, rec: StepRecorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        rec = self.rec
        if rec.paused or rec.modules.depth or getattr(func, "namespace", None) == "profiler":
            # profiler ops: the ``record_function`` that ``optimizer.step()`` opens before its
            # hooks run (and so before the tape is paused) changes nothing a replay needs
            return func(*args, **kwargs)
        if rec.truncated or not rec.enabled:
            calls = rec.calls
            if calls is not None:  # before the first step: the lines are still counted
                calls.op(user_site(2), torch.is_grad_enabled())
            return func(*args, **kwargs)
        return rec._tape_op(func, args, kwargs)


@dataclass
class StepFacts:
    """What the recorder learned of the step in progress; a new one at each step."""

    #: the tape filled after the forward began: the recorder stood aside for the rest
    truncated: bool = False
    #: a rollout with grad (see :class:`StepRecorder`): nothing more is recorded in the step
    lean: bool = False
    #: did the recorder stand aside at some point (ops then made values it did not see), and
    #: did a ``DataLoader`` hand out a batch?
    stood_aside: bool = False
    loaded_batch: bool = False
    #: what the loss's autograd graph showed when ``backward()`` was called on a non-finite
    #: loss of a step the tape did not keep whole (``_graph_origin``)
    graph_finding: Finding | None = None
    #: has this step's forward pass begun (a model call, an op on a tensor that requires grad)?
    forward_started: bool = False
    #: storages allocated by this step's ops before its forward
    fresh: set[int] = dataclasses.field(default_factory=set)
    #: forwards that built no graph (``no_grad``: an environment step, evaluation): the first is
    #: recorded (a target network's output may feed the loss); from the second on neither they
    #: nor the ops between them are, until a forward builds a graph again (``disarmed``)
    nograd_calls: int = 0
    disarmed: bool = False
    #: ``id`` of each ``.grad`` of the watched weights, kept until the next backward or step
    grad_ids: dict[int, weakref.ref[torch.Tensor]] | None = None
    #: per module, its forwards with grad since the last ``backward()`` whose inputs no earlier
    #: model call of the step made; from a module's :data:`LEAN_AFTER`-th on the step is ``lean``
    grad_calls: dict[int, int] = dataclasses.field(default_factory=dict)
    pending_root: RootCall | None = None


class StepRecorder:
    """Keeps the events of the current step (see the module docstring).

    ``max_events`` bounds the tape of one step. Before the step's forward pass starts (building
    a model, preparing a batch: what the first step of a script records) a full tape is emptied
    and the replay treats what those events made as coming from outside; after it, the recorder
    stands aside for the rest of the step (``truncated``): nothing more can be replayed, so the
    ops pass through until the next model call pops the tape, which stays off until the next
    step (a REINFORCE episode of 500 forwards with grad, ~35 ops outside modules each, fills
    the tape after ~120 of them; it goes lean long before, below).

    A step goes ``lean`` at the :data:`LEAN_AFTER`-th call with grad of one module since the last
    ``backward()`` whose arguments no earlier model call of the step made (a rollout with grad:
    ``reinforce.py``'s policy, once per environment step): the tape is popped until the step
    ends. Told in :meth:`root_enter`, when a top-level module call begins. A recurrence (an RNN
    cell fed its hidden state) stays recorded however long.
    """

    def __init__(self, modules: ModuleStack, max_events: int = 4096) -> None:
        self.modules = modules
        self.max_events = max_events
        self.events: list[Event] = []
        self.paused = 0
        self._made = MadeRefs()  # tensor -> Ref
        self._tape = _Tape(self)
        self._tape_on = False
        self.enabled = True
        self.resume_tape = False  # set while a guard is attached
        #: popped by ``optimizer.step()``'s ``record_function`` region, which pushes it again
        #: when it closes (``_patches._profile_exit``): the post-step hook need not
        self.held_by_region = False
        #: told when the step's forwards stop building a graph (the second ``no_grad`` model
        #: call: an evaluation loop, a rollout) and when one builds a graph again
        self.on_quiet: Callable[[bool], None] | None = None
        #: the ``.grad`` of each watched weight (set by the guard)
        self.grads_now: Callable[[], list[torch.Tensor]] | None = None
        #: (storage, shape, dtype) of what the model calls of this step / the previous one
        #: returned: a model input that is one of them is state the script carries across steps
        self._outputs: set[tuple[int, tuple[int, ...], torch.dtype]] = set()
        self.prev_outputs: set[tuple[int, tuple[int, ...], torch.dtype]] = set()
        #: what the recorder learned of the step in progress (new for each step)
        self.facts = StepFacts()
        self.modules.quiet = False
        #: until the first step ends: the script's torch calls per line (set by the session)
        self.calls: ScriptCalls | None = None
        #: until the first step ends (set by the data look): the model calls' and the regression
        #: losses' own arguments, ``("call", module, args, kwargs)`` / ``("op", name, args)``,
        #: and what the first recorded model call with grad returned, ``("out", module, output)``
        self.capture: list[tuple[Any, ...]] | None = None
        self._out_captured = False

    # --- the step's facts, as the guard reads them ------------------------------------------------
    @property
    def truncated(self) -> bool:
        return self.facts.truncated

    @property
    def lean(self) -> bool:
        return self.facts.lean

    @property
    def stood_aside(self) -> bool:
        return self.facts.stood_aside

    @property
    def loaded_batch(self) -> bool:
        return self.facts.loaded_batch

    @loaded_batch.setter
    def loaded_batch(self, value: bool) -> None:
        self.facts.loaded_batch = value

    @property
    def graph_finding(self) -> Finding | None:
        return self.facts.graph_finding

    @graph_finding.setter
    def graph_finding(self, value: Finding | None) -> None:
        self.facts.graph_finding = value

    # --- tape push/pop --------------------------------------------------------------------------
    @property
    def tape_is_on(self) -> bool:
        return self._tape_on

    def tape_on(self) -> None:
        if (self._tape_on or not self.enabled or not self.resume_tape or self.paused or self.facts.disarmed
                or self.facts.truncated or torch.is_inference_mode_enabled()):
            return  # under inference mode never: its exit restores the dispatch keys of its entry
        self._tape.__enter__()
        self._tape_on = True

    def tape_off(self) -> None:
        if not self._tape_on:
            return
        if _get_current_dispatch_mode() is self._tape:
            self._tape.__exit__(None, None, None)
            self._tape_on = False
        # else: another mode was pushed above ours; leave the stack alone, ours passes through

    def hold(self) -> None:
        """Stop recording (a backward pass, the optimizer step, a trial) until :meth:`release`."""
        self.paused += 1
        self.tape_off()

    def release(self, push: bool = True) -> None:
        """The end of a :meth:`hold`: recording goes on (``push``: the tape is pushed again
        when nothing else holds it and no module runs). A release without a hold is a bug of
        ours: it raises instead of hiding an unbalanced pair."""
        if self.paused <= 0:
            raise StepOrderError("nanguard: the step recorder was released more often than held: "
                                 "an error inside nanguard, please report it")
        self.paused -= 1
        if push and not self.paused and not self.modules.depth:
            self.tape_on()

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """No recording inside (backward, optimizer step, data loading, the replay itself)."""
        self.paused += 1
        was_on = self._tape_on
        self.tape_off()
        try:
            yield
        finally:
            self.paused -= 1
            if was_on and not self.paused and not self.modules.depth:
                self.tape_on()

    # --- recording --------------------------------------------------------------------------------
    def new_step(self) -> None:
        self.prev_outputs, self._outputs = self._outputs, set()
        self.events = []
        self._made = MadeRefs()
        self.facts = StepFacts()
        self.modules.quiet = False

    @property
    def incomplete(self) -> bool:
        """Did this step's tape lose events it needed (full, or lean)? A replay cannot re-run it."""
        return self.facts.truncated or self.facts.lean

    def _spec(self, obj: Any) -> Any:
        """``obj`` with each tensor an earlier event made replaced by its :class:`Ref`."""
        if isinstance(obj, torch.Tensor):
            ref = self._made.get(obj)
            return ref if ref is not None else obj
        if isinstance(obj, (list, tuple)):
            made = self._made.get
            items: list[Any] = []
            for v in obj:  # inline for the usual flat arguments (tensors, ints, dtypes)
                if isinstance(v, torch.Tensor):
                    ref = made(v)
                    items.append(ref if ref is not None else v)
                elif isinstance(v, _NESTED):
                    items.append(self._spec(v))
                else:
                    items.append(v)
            return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
        if isinstance(obj, dict):
            return {k: self._spec(v) for k, v in obj.items()}
        return obj

    def _append(self, ev: Event) -> int:
        if len(self.events) >= self.max_events:
            if not self.facts.forward_started and not isinstance(ev, RootCall):
                # set-up before the forward pass (a 400-layer model's initialisation fills the
                # tape): none of it is needed to re-run the step; its results become inputs
                self.events = []
                self._made = MadeRefs()
            else:
                self.facts.truncated = self.facts.stood_aside = True  # see the class docstring
                return -1
        self.events.append(ev)
        return len(self.events) - 1

    def _register_outputs(self, idx: int, outs: list[torch.Tensor]) -> int:
        for j, t in enumerate(outs):
            self._made[t] = Ref(idx, j)
        return len(outs)

    def _tape_op(self, func: Any, args: Any, kwargs: Any, run: Callable[[], Any] | None = None) -> Any:
        info = _op_info(func)
        rng = RngState.capture() if info[0] else None
        sargs, skw = self._spec(args), (self._spec(kwargs) if kwargs else kwargs)
        mutated = mutated_args(func, args, kwargs) if info[1] else []
        external = [t for t in mutated if self._made.get(t) is None]
        prelude = None
        flat_args = _flat(args) if not self.facts.forward_started else []
        if not self.facts.forward_started:
            # before this step's forward pass, an in-place write into memory this step did not
            # allocate (``p.data -= lr * p.grad`` writes through a detached alias of p) is the last
            # step's update or gradient zeroing
            aliased = [t for t in mutated if storage_key(t) not in self.facts.fresh]
            if aliased:
                prelude = aliased
            elif (torch.is_grad_enabled() and _builds_graph(func)
                  and any(getattr(a, "requires_grad", False) for a in flat_args)):
                self.facts.forward_started = True
        if prelude is None and external:
            # an in-place op on a tensor from outside the step: keep what it overwrote (one walk
            # for all of them) — but not of a gradient (``clip_grad_norm_`` scales them all at
            # every step): a replay gives the op the gradient its own backward made instead
            copies = {id(t): t.detach().clone() for t in external if not self._is_gradient(t)}
            if copies:
                sargs, skw = _replace(sargs, copies), _replace(skw, copies)
        grad = torch.is_grad_enabled()
        if self.calls is None:
            where = user_frame(2)
        else:  # before the first step: the runs of each line are counted too
            site = user_site(2)
            where = site[0] if site is not None else None
            self.calls.op(site, grad)
        ev = TapeOp(func, sargs, skw, grad, where, rng)
        ev.prelude = prelude
        if self.capture is not None:
            name = getattr(func, "__name__", "").split(".")[0]  # F.mse_loss, or aten.mse_loss.default
            if name in _REGRESSION:
                self.capture.append(("op", name, args))
        gen = kwargs.get("generator") if kwargs else None
        if gen is not None and isinstance(gen, torch.Generator):
            # torch.randint(..., generator=g): the replay must draw the same numbers from g
            ev.generator = (gen, gen.get_state())
        idx = self._append(ev)  # before running it: an op that raises is part of the step too
        out = func(*args, **kwargs) if run is None else run()
        if idx >= 0:
            ev.n_out = self._register_outputs(idx, mutated if mutated else _flat(out))
        if not self.facts.forward_started:
            ins = {storage_key(a) for a in flat_args}
            self.facts.fresh.update(k for k in (storage_key(t) for t in _flat(out)) if k not in ins)
        return out

    def _is_gradient(self, t: torch.Tensor) -> bool:
        """Is ``t`` the ``.grad`` of a watched weight? The gradients (``grads_now``) are listed
        once per backward, held weakly (an ``id`` freed since is no match), and only when an
        in-place op outside modules writes a tensor from outside."""
        if self.facts.grad_ids is None:
            grads = self.grads_now() if self.grads_now is not None else []
            self.facts.grad_ids = {id(g): weakref.ref(g) for g in grads}
        ref = self.facts.grad_ids.get(id(t))
        return ref is not None and ref() is t

    def record_call(self, fn: Any, args: Any, kwargs: Any, run: Callable[[], Any] | None = None) -> Any:
        """Run ``fn`` (a ``torch.nn.functional`` loss, with the tape popped) as one tape event:
        called by its wrapper (``_patches.FUNCTIONAL``) where its ops would have been taped.
        ``run``: what runs now instead, whose result is the event's (``clip_grad_norm_``, whose
        replay is ``fn``: the total norm alone, on the replayed gradients)."""
        return self._tape_op(fn, args, kwargs, run)

    def root_enter(self, mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.tape_off()
        grad = torch.is_grad_enabled()
        if self.calls is not None:
            self.calls.root(grad)
        if self.paused or not self.enabled or self.facts.truncated or self.facts.lean:
            return
        if not grad:
            self.facts.nograd_calls += 1
            # not under inference_mode: it restores the whole dispatch-key set when it exits, so
            # a tape popped inside it and left off would leave the Python key on with no mode
            # (torch's INTERNAL ASSERT at the next factory call); there every call stays balanced
            if self.facts.nograd_calls > 1 and not torch.is_inference_mode_enabled():
                self.facts.disarmed = True  # many forwards without a graph: an RL rollout, an eval loop
                if self.calls is not None:
                    self.calls.complete = False  # the tape is off: lines run now go uncounted
                self.modules.quiet = self.facts.stood_aside = True
                self.facts.pending_root = None
                if self.on_quiet is not None:
                    self.on_quiet(True)
                return
        else:
            if self.facts.disarmed and self.on_quiet is not None:
                self.on_quiet(False)
            self.facts.disarmed = self.modules.quiet = False
        sargs, skw = self._spec(args), self._spec(kwargs)
        if grad and not self._from_model((sargs, skw)):
            n = self.facts.grad_calls[id(mod)] = self.facts.grad_calls.get(id(mod), 0) + 1
            if n >= LEAN_AFTER:
                self.facts.lean = self.facts.disarmed = self.facts.stood_aside = True  # a rollout with grad
                if self.calls is not None:
                    self.calls.complete = False
                self.facts.pending_root = None
                return
        self.facts.forward_started = True
        ev = RootCall(mod, sargs, skw, grad, user_frame(3), RngState.capture(),
                      autocast=autocast_state())
        self.facts.pending_root = ev
        if self.capture is not None:
            self.capture.append(("call", mod, args, kwargs))

    def _from_model(self, spec: Any) -> bool:
        """Do the recorded arguments of a model call derive from an earlier model call of this
        step (a recurrence: an RNN cell's hidden state, a decoder fed its last output)?"""
        todo = [a.event for a in _flat_refs(spec)]
        seen: set[int] = set()
        while todo:
            i = todo.pop()
            if i in seen or i >= len(self.events):
                continue
            seen.add(i)
            ev = self.events[i]
            if isinstance(ev, RootCall):
                return True
            if isinstance(ev, TapeOp):
                todo.extend(a.event for a in _flat_refs((ev.args, ev.kwargs)))
        return False

    def root_exit(self, mod: nn.Module, output: Any) -> None:
        ev = self.facts.pending_root
        if ev is not None and ev.module is mod and not self.paused:
            idx = self._append(ev)
            if idx >= 0:
                outs = _flat(output)
                ev.n_out = self._register_outputs(idx, outs)
                if ev.grad_enabled:  # a training forward (not the many no_grad ones of RL)
                    self._outputs.update(_carry_key(t) for t in outs if t.is_floating_point())
            if (self.capture is not None and ev.grad_enabled and not self._out_captured
                    and next(iter(mod.parameters()), None) is not None):
                self._out_captured = True  # the model's first training forward only: one batch
                self.capture.append(("out", mod, output))
        self.facts.pending_root = None
        if not self.paused:
            self.tape_on()

    def backward(self, kind: str, roots: Any, grads: Any, inputs: Any) -> None:
        """Just before a ``backward()`` runs: its roots join the tape (not on a lean step, whose
        loss was made by ops nothing recorded: no replay re-runs it)."""
        self.facts.grad_calls = {}
        self.facts.grad_ids = None  # the backward may make new gradient tensors
        if not self.enabled or self.facts.lean:
            return
        self._append(Backward(kind, self._spec(list(roots)), self._spec(list(grads)),
                              inputs, user_frame(4)))

    @property
    def has_events(self) -> bool:
        return bool(self.events)


#: ops that read only the shape, dtype or device of a tensor that requires grad: they build no
#: autograd graph, so they do not start a forward pass (``nn.init.orthogonal_`` calls
#: ``weight.new_empty(...)`` while a model is built)
_NO_GRAPH = frozenset({
    "new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "empty_like", "zeros_like",
    "ones_like", "full_like", "rand_like", "randn_like", "randint_like", "detach", "alias",
    "_local_scalar_dense", "is_nonzero", "equal",
})


def _builds_graph(func: Any) -> bool:
    name = getattr(getattr(func, "overloadpacket", None), "__name__", "")
    return name not in _NO_GRAPH


def autocast_state() -> tuple[tuple[str, torch.dtype], ...]:
    """The ``torch.autocast`` regions the code runs in now: ``(("cpu", torch.float16),)``. A model
    called under autocast and replayed outside it would run in float32 and never overflow."""
    out = []
    for dev in AUTOCAST_DEVICES:
        try:
            if torch.is_autocast_enabled(dev):
                out.append((dev, torch.get_autocast_dtype(dev)))
        except (TypeError, AttributeError, RuntimeError):  # torch < 2.4 spells it per device
            continue
    return tuple(out)


AUTOCAST_DEVICES = ("cpu", "cuda")


_OP_INFO: dict[Any, tuple[bool, bool]] = {}


#: the regression losses whose targets tell the data's scale (see :mod:`._datascale`)
_REGRESSION = {"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"}


def _op_info(func: Any) -> tuple[bool, bool]:
    """(draws random numbers, writes an argument in place) — computed once per op."""
    info = _OP_INFO.get(func)
    if info is None:
        name = getattr(func, "__name__", str(func))
        info = (any(w in name for w in _RANDOM_WORDS), bool(_writes(func)))
        _OP_INFO[func] = info
    return info


#: op -> its written arguments, (position or ``None`` when keyword-only, name)
_WRITES: dict[Any, tuple[tuple[int | None, str], ...]] = {}


def _writes(func: Any) -> tuple[tuple[int | None, str], ...]:
    """The arguments ``func`` writes in place, read from its schema once (none for a Python
    function recorded whole, ``record_call``: it has no schema)."""
    w = _WRITES.get(func)
    if w is None:
        schema = getattr(func, "_schema", None)
        w = () if schema is None else tuple(
            (None if a.kwarg_only else i, a.name) for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write)
        _WRITES[func] = w
    return w


def mutated_args(func: Any, args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensors an op writes in place (``self`` of ``add_``, ``out=``, the lists of foreach);
    none for a Python function recorded whole (``StepRecorder.record_call``). The schema is read
    once per op (this runs for every in-place op on the tape)."""
    out: list[torch.Tensor] = []
    for i, name in _writes(func):
        if i is not None and i < len(args):
            out.extend(_flat(args[i]))
        elif kwargs and name in kwargs:
            out.extend(_flat(kwargs[name]))
    return out


def _replace(obj: Any, copies: dict[int, torch.Tensor]) -> Any:
    """``obj`` with each tensor whose ``id`` is in ``copies`` replaced by its copy."""
    if isinstance(obj, torch.Tensor):
        return copies.get(id(obj), obj)
    if isinstance(obj, (list, tuple)):
        items = [_replace(v, copies) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, dict):
        return {k: _replace(v, copies) for k, v in obj.items()}
    return obj


def finite_scalar(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
