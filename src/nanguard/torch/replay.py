"""The replayer: a failed step's recorded events re-run under the locator, to find where its
NaN/Inf was made, and the finding that comes of it.

Runs only after the watch tier saw a non-finite loss or gradient (so it costs nothing until a
failure). The step's events are re-executed in order — root module calls with the RNG state they
started with, tape ops with their recorded source lines, backward passes through
``torch.autograd.grad`` (so no ``.grad`` is touched) — on the weights as they were before the
update. Module buffers (BatchNorm statistics) and the RNG are put back afterwards: a replay leaves
no trace.

:class:`Replayer` is the guard's part that turns a failed check into a
:class:`~nanguard.core.finding.Finding`: the replay's (:meth:`Replayer.locate`); where the replay
cannot name the op, the watch's own numbers (:meth:`Replayer.watch_finding`) — and where the
replay itself failed, the finding says so, as an error of nanguard's, never as a fact about the
run. A failed check *after* an update is the optimizer's (:meth:`Replayer.optimizer_finding`,
with the update replayed op by op when a copy was kept), or — before any update — weights that
came in non-finite (:meth:`Replayer.parameter_finding`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from ..core.controller import StepController
from ..core.errors import internal_error
from ..core.finding import Finding
from ..core.source import user_frame
from . import _autograd, _dist
from ._collectives import CollectiveInReplay, NoCollectives, is_collective
from ._mode import LocatorMode
from ._modules import ModuleStack, storage_key, unwrap
from ._options import LocateOptions
from ._recorder import (
    Backward,
    Event,
    Ref,
    RngState,
    RootCall,
    StepRecorder,
    TapeOp,
    _flat,
    autocast_state,
    carried_inputs,
    mutated_args,
)
from ._sharded import local
from ._stats import checkable, finding_for
from ._update_replay import UpdateReplay
from ._watched import WatchSet
from .locator import Locator, graph_leaves
from .watch import NormCheck

__all__ = ["Replayer", "module_of", "replay"]


@contextlib.contextmanager
def _preserved(modules: Sequence[nn.Module], generators: Sequence[torch.Generator] = ()) -> Iterator[None]:
    """Put buffers, the RNG and the user's own generators back the way they were."""
    rng = RngState.capture()
    gens = [(g, g.get_state()) for g in generators]
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    seen: set[int] = set()
    for m in modules:
        for b in m.buffers():
            if id(b) not in seen and b.device.type != "meta":
                seen.add(id(b))
                saved.append((b, b.detach().clone()))
    try:
        yield
    finally:
        with torch.no_grad():
            for b, v in saved:
                if b.shape == v.shape:
                    b.copy_(v)
        rng.restore()
        for g, st in gens:
            g.set_state(st)


class _Values:
    """Replayed counterparts: of tensors made by events (by :class:`Ref`), and of the real
    ``.grad`` tensors (by identity) once the replay's own backward has computed them."""

    def __init__(self) -> None:
        self.made: dict[Ref, torch.Tensor] = {}
        self.grads: dict[int, torch.Tensor] = {}  # id(real p.grad) -> replayed gradient
        self.grad_ids: dict[int, str] = {}  # id of a replayed gradient (or its base) -> weight name
        self._keep: list[torch.Tensor] = []
        #: the sum of each replayed backward's roots (the step's loss, re-run)
        self.losses: list[float] = []
        #: storage -> the collective of the script's own that read or wrote it (not re-run)
        self.tainted: dict[int, str] = {}

    def tainted_by(self, *objs: Any) -> str | None:
        """The collective (not re-run) that read or wrote what an event is about to read, if any:
        its result is not here. An op outside any module that reads it (the script's log of the
        gathered losses) is skipped, its outputs left unmade; a model call that reads it stops
        the replay."""
        if self.tainted:
            for t in _flat(list(objs)):
                op = self.tainted.get(storage_key(t))
                if op is not None:
                    return op
        return None

    def resolve(self, obj: Any, clone_ext: bool = False) -> Any:
        if isinstance(obj, Ref):
            v = self.made.get(obj)
            if v is None:
                raise KeyError(obj)
            return v
        if isinstance(obj, torch.Tensor):
            g = self.grads.get(id(obj))
            if g is not None:
                return g
            return obj.detach().clone() if clone_ext else obj
        if isinstance(obj, (list, tuple)):
            items = [self.resolve(v, clone_ext) for v in obj]
            return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
        if isinstance(obj, dict):
            return {k: self.resolve(v, clone_ext) for k, v in obj.items()}
        return obj

    def add_grad(self, real: torch.Tensor, replayed: torch.Tensor, name: str) -> None:
        self._keep.append(replayed)  # ids stay unique while the replay runs
        self.grads[id(real)] = replayed
        self.grad_ids[id(replayed)] = name
        if replayed._base is not None:  # a gradient can itself be a view (addmm's weight grad)
            self.grad_ids[id(replayed._base)] = name

    def is_grad(self, t: torch.Tensor) -> str | None:
        """The weight name if ``t`` is (a view of) a replayed gradient, else ``None``."""
        name = self.grad_ids.get(id(t))
        if name is None and t._base is not None:
            name = self.grad_ids.get(id(t._base))
        return name


def replay(
    events: Sequence[Event],
    *,
    model: nn.Module | None,
    modules: ModuleStack,
    step: int | None,
    sinks: Sequence[tuple[Ref, str]] = (),
) -> tuple[Finding | None, dict[str, Any]]:
    """Re-run ``events`` under a recording locator; return its first finding.

    ``sinks`` are further values that must stay finite, made by recorded events (e.g. the total
    norm that ``clip_grad_norm_`` returned), with a description for the finding.
    The second value holds side evidence for the diagnosis: ``activation_scale`` (max |x| at the
    output of each module, in call order), ``complete`` (whether every event could be re-run) and
    ``error`` (the words for an error the replay itself met: :func:`~nanguard.core.errors.internal_error`),
    ``collective`` (the collective it stopped before: :class:`NoCollectives`) and ``replayed_loss``.
    """
    roots = [ev.module for ev in events if isinstance(ev, RootCall)]
    if model is not None:
        roots.insert(0, model)
    stack = ModuleStack(model)
    values = _Values()
    loc = LocatorMode(model, modules=stack, options=LocateOptions(
        on_sink="record", unused="ignore", step=step, detected_by="replay", frame_stop=_STOP,
        is_grad=values.is_grad,
    ))
    for r in roots:
        stack.roots_seen.add(r)
    scale: list[tuple[str, float]] = []

    def on_exit(mod: nn.Module, output: Any) -> None:
        loc.tag_module_output(mod, output)
        ts = [t for t in _flat(output) if checkable(t)]
        if ts and len(scale) < 512:
            try:
                v = max(float(t.detach().abs().max()) for t in ts)
            except RuntimeError:
                return
            scale.append((stack.path_of(mod), v))

    stack.on_exit = on_exit
    stack.install()
    try:
        gens = list({id(ev.generator[0]): ev.generator[0] for ev in events
                     if isinstance(ev, TapeOp) and ev.generator is not None}.values())
        with _preserved(roots, gens), loc, NoCollectives():
            extra = _run_events(events, values, loc, sinks)
    finally:
        stack.remove()
    extra["activation_scale"] = scale
    if values.losses:
        extra["replayed_loss"] = math.fsum(values.losses)
    finding = loc.findings[0] if loc.findings else None
    if finding is not None and loc.notes:
        finding.details.setdefault("note", "; ".join(sorted(loc.notes)))
    return finding, extra


def _run_events(events: Sequence[Event], values: _Values, loc: LocatorMode,
                sinks: Sequence[tuple[Ref, str]]) -> dict[str, Any]:
    """Re-run ``events`` in order until the locator has a finding; what the run met: ``complete``
    (every event re-run), ``error`` (the replay itself failed), ``collective`` (the op it stopped
    before)."""
    extra: dict[str, Any] = {"complete": True}
    produced: set[int] = set()
    grad_fn = _autograd.original_grad()
    for i, ev in enumerate(events):
        try:
            if isinstance(ev, TapeOp):
                _run_op(ev, i, values, loc, produced)
            elif isinstance(ev, RootCall):
                _run_root(ev, i, values, loc, produced)
            elif isinstance(ev, Backward):
                _run_backward(ev, values, loc, grad_fn)
        except KeyError:
            extra["complete"] = False  # made by an event dropped from a long tape
            continue
        except CollectiveInReplay as exc:
            extra["complete"], extra["collective"] = False, exc.op  # on one rank it would wait forever
            break
        except Exception as exc:
            # an op raised again (multinomial on NaN probabilities): the locator has
            # recorded whether a non-finite input was why; nothing after it can run
            extra["complete"] = bool(loc.findings)
            if not loc.findings:  # raised for another reason: the replay failed
                extra["error"] = internal_error("the replay of this step", exc)
            break
        _check_sinks(sinks, i, values, loc)
        if loc.findings:
            break
    return extra


def _check_sinks(sinks: Sequence[tuple[Ref, str]], i: int, values: _Values, loc: LocatorMode) -> None:
    """The extra sinks event ``i`` made (``clip_grad_norm_``'s total norms): non-finite ones
    reach the locator as what they are."""
    for ref, what in sinks:
        t = values.made.get(ref)
        if ref.event == i and t is not None and checkable(t) and not bool(torch.isfinite(t).all()):
            origin = loc.origin_of(t)
            if origin is not None:
                loc.reach(origin, what, sink=what, clip_total_norm=float(t.detach().float().abs().max()))


def _run_op(ev: TapeOp, i: int, values: _Values, loc: LocatorMode, produced: set[int]) -> None:
    if is_collective(ev.func):
        # the script's own, outside any module (a gather of the loss for its log): never run
        # again — what it read and wrote is marked, and an event that reads it stops the replay
        for t in _flat([values.resolve(ev.args), values.resolve(ev.kwargs)]):
            values.tainted[storage_key(t)] = str(ev.func)
        return
    if ev.prelude is not None:
        # the last step's hand-written update: already in the weights this step used
        for j, t in enumerate(ev.prelude):
            values.made[Ref(i, j)] = t
        return
    mutated_ext = bool(mutated_args(ev.func, ev.args, ev.kwargs))
    args = values.resolve(ev.args, clone_ext=mutated_ext)
    kwargs = values.resolve(ev.kwargs, clone_ext=mutated_ext)
    if values.tainted_by(args, kwargs):
        return  # reads a collective's result (a log of the gathered losses): not re-run
    mut = mutated_args(ev.func, args, kwargs)
    if mutated_ext:
        produced.update(storage_key(t) for t in _flat([args, kwargs]))  # the fresh copies
    for t in mut:
        # an in-place op on memory the replay did not make (a view or a detached alias of the
        # batch or a weight): its effect is already in that tensor; running it again would
        # change the user's data
        if storage_key(t) not in produced and not values.is_grad(t):
            for j, m in enumerate(mut):
                values.made[Ref(i, j)] = m
            return
    if ev.rng is not None:
        ev.rng.restore()
    if ev.generator is not None:
        ev.generator[0].set_state(ev.generator[1])
    with loc.running(source=ev.source), torch.set_grad_enabled(ev.grad_enabled):
        out = ev.func(*args, **kwargs)
    outs = mut if mut else _flat(out)
    ins = {storage_key(a) for a in _flat([args, kwargs])}
    for j, t in enumerate(outs):
        values.made[Ref(i, j)] = t
        key = storage_key(t)
        if key not in ins or key in produced:
            produced.add(key)


def _run_root(ev: RootCall, i: int, values: _Values, loc: LocatorMode, produced: set[int]) -> None:
    args = values.resolve(ev.args)
    kwargs = values.resolve(ev.kwargs)
    op = values.tainted_by(args, kwargs)
    if op is not None:
        raise CollectiveInReplay(op)  # the model reads a collective's result: cannot re-run it
    ev.rng.restore()
    # torch.compile'd: the replay runs the same module eagerly; DistributedDataParallel: the
    # module itself, with no gradient all-reduce (the other ranks are not in the replay)
    module = unwrap(ev.module)
    if isinstance(getattr(ev.module, "_orig_mod", None), nn.Module):
        loc.note("the model is compiled with torch.compile; the replay ran it eagerly")
    with loc.running(call=ev.source), torch.set_grad_enabled(ev.grad_enabled), contextlib.ExitStack() as regions:
        # the autocast regions the call ran in, and none other (a replay may start inside one)
        on = dict(ev.autocast)
        for dev in set(on) | {d for d, _ in autocast_state()}:
            regions.enter_context(torch.autocast(dev, dtype=on.get(dev), enabled=dev in on))
        out = module(*args, **kwargs)
    for j, t in enumerate(_flat(out)):
        values.made[Ref(i, j)] = t
        produced.add(storage_key(t))


def _run_backward(ev: Backward, values: _Values, loc: LocatorMode, grad_fn: Any) -> None:
    roots = values.resolve(ev.roots)
    grads = values.resolve(ev.grads)
    with loc.running(source=ev.source):
        loc.check_roots(roots)
    if loc.findings:
        return
    values.losses.extend(float(r.detach().double().sum()) for r in roots if isinstance(r, torch.Tensor))
    pairs = [(r, g) for r, g in zip(roots, grads + [None] * (len(roots) - len(grads)))
             if isinstance(r, torch.Tensor) and r.requires_grad]
    if not pairs:
        return
    rs = [r for r, _ in pairs]
    gs = [g if g is not None else torch.ones_like(r) for r, g in pairs]
    leaves = list(ev.inputs) if ev.inputs else graph_leaves(rs)
    leaves = [t for t in leaves if t.requires_grad]
    if not leaves:
        return
    res = grad_fn(rs, leaves, gs, retain_graph=True, allow_unused=True)
    loc.after_backward(())  # code after it reads the replayed gradients (values.is_grad)
    for leaf, g in zip(leaves, res):
        if g is not None and leaf.grad is not None:
            # code after backward() (clipping, a hand-written update) reads leaf.grad: give it
            # the replayed gradient, never the real one
            values.add_grad(leaf.grad, g, loc.param_name(leaf) or "?")
    loc.check_grads(leaves, list(res))


_STOP = frozenset({_run_op.__code__, _run_root.__code__, _run_backward.__code__})


def module_of(name: str) -> str:
    """The module that owns the weight ``name`` (``"encoder.fc1"`` for ``"encoder.fc1.weight"``;
    ``""`` — the model itself — for a weight of the root; an optimizer state's ``:exp_avg`` is
    dropped first)."""
    name = name.split(":")[0]
    return name.rsplit(".", 1)[0] if "." in name else ""


class Replayer:
    """Makes the finding of a failed step: the replay of its recorded events under the locator,
    the replay of a failed update, or the watch's own numbers."""

    def __init__(self, model: nn.Module | None, modules: ModuleStack, recorder: StepRecorder,
                 watch: WatchSet, controller: StepController, enabled: bool = True) -> None:
        self.model = model
        self.modules = modules
        self.recorder = recorder
        self.watch = watch
        self.controller = controller
        self.enabled = enabled
        #: the copy kept before a healthy update, to replay it if it made the weights non-finite
        self.updates = UpdateReplay()
        #: the tracer that recorded its findings instead of raising (``--trace`` under torchrun):
        #: the step's check takes the first of its step, every rank having agreed on the failure
        self.live: Locator | None = None

    def locate(self, chk: NormCheck, params: Sequence[torch.Tensor], step: int, sinks: Sequence[Any],
               events: Sequence[Event] | None = None) -> Finding:
        """Replay the step's recorded events (``events``: a past step's, for the deferred watch)
        under the locator; the finding of the op that made the value — or the watch's, with a
        note saying why the replay did not name it."""
        events = self.recorder.events if events is None else events
        finding = None
        extra: dict[str, Any] = {}
        if self.enabled and events:
            try:
                finding, extra = replay(events, model=self.model, modules=self.modules, step=step,
                                        sinks=sinks)
            except Exception as exc:  # a bug of ours: said as such, never as a fact about the run
                extra = {"error": internal_error("the replay of this step", exc)}
        if finding is None and self.live is not None:
            finding = self._live(step, chk, params)
        if finding is None and self.recorder.graph_finding is not None:
            finding = self.recorder.graph_finding  # the tape was not whole: what the graph showed
        if finding is None and extra.get("collective"):
            finding = self._weights_came_in(step, extra["collective"])
        if finding is None:
            finding = self.watch_finding(chk, params, step)
            if extra.get("error"):
                finding.details["note"] = (f"{extra['error']} (an error inside nanguard, not in the run); "
                                           "run with nanguard.locate() / --trace for the exact op")
                finding.details["replay_error"] = extra["error"]
            elif extra.get("collective"):
                finding.details.setdefault(
                    "note",
                    f"the replay of this step stopped before `{extra['collective']}`, a collective "
                    "(replayed on one rank, it would wait on the others): the op is not named",
                )
            elif self.enabled:
                self._not_reproduced(finding, chk, extra)
        scale = extra.get("activation_scale") or []
        if scale:
            finding.details.setdefault("activation_scale", scale[:32])
        if finding.phase == "data":
            self._mark_carried(finding)
            self._mark_unrecorded(finding)
        if _dist.active():
            finding.rank = _dist.rank()
        return finding

    def _live(self, step: int, chk: NormCheck, params: Sequence[torch.Tensor]) -> Finding | None:
        """The tracer's first finding of ``step`` (taken: the list is emptied). A value a collective
        wrote was received from another rank (said so: a rank that made one is preferred); on a
        rank whose own loss was finite, a value met untracked (the gradient reduction runs out of
        the tracer's sight) is no finding of this rank's: the watch's is used."""
        assert self.live is not None
        found = self.live.findings
        if not any(f.step in (step, None) for f in found):
            self.live.reach_gradients([local(p.grad) for p in params if p.grad is not None])
        if not any(f.step in (step, None) for f in found):
            self.live.judge_open("at the step's check, which found non-finite values")
        mine = [f for f in found if f.step in (step, None)]
        found.clear()
        if not mine:
            return None
        f = mine[0]
        collective = (f.op or "").split(".")[0] in ("c10d", "_c10d_functional", "c10d_functional")
        untracked = f.op is None or f.phase == "data" or "constant" in f.details
        if untracked and all(math.isfinite(v) for v in chk.losses):
            return None  # met untracked (the reduction ran out of the tracer's sight): the watch's
        if collective:
            f.details["received"] = True
            f.details["note"] = (f"`{f.op}` wrote it: a collective, which brought another rank's non-finite "
                                 "values to this one")
        return f

    @staticmethod
    def _not_reproduced(finding: Finding, chk: NormCheck, extra: dict[str, Any]) -> None:
        """The replay met no non-finite value. Said apart: a replay that could not re-run the whole
        step; under torch.distributed, a rank whose own loss and gradients were finite (its
        non-finite gradients came from another rank through the gradient reduction); else a step
        that, re-run whole on the same batch and weights, was finite (nondeterminism or a fault)."""
        loss = extra.get("replayed_loss")
        whole = extra.get("complete", False) and isinstance(loss, float) and math.isfinite(loss)
        if not whole:
            note = ("the replay of this step did not reproduce the non-finite value (it could not re-run "
                    "the whole step); run with nanguard.locate() / --trace for the exact op")
        elif _dist.active() and all(math.isfinite(v) for v in chk.losses):
            finding.details["received"] = True
            note = (f"this rank's loss was finite and its own gradients, re-run, were finite too (loss "
                    f"{loss:.6g}): its non-finite gradients came from another rank through the gradient "
                    "reduction")
        else:
            finding.details["reproduced"] = False
            note = (f"did not reproduce: the step re-run on the same batch and the same weights gave a "
                    f"finite loss ({loss:.6g}) and finite gradients, where the step itself had non-finite "
                    "values: a nondeterministic op (a GPU's atomic adds, an unseeded sampler) or a "
                    "hardware fault, not an op the replay can name; run with --trace to catch it live")
        finding.details.setdefault("note", note)

    def _mark_unrecorded(self, finding: Finding) -> None:
        """A non-finite input in a step where the recorder stood aside for ``no_grad`` forwards
        (an RL rollout) and no ``DataLoader`` handed out a batch: it was made by ops nanguard did
        not record (a return, an advantage, an observation the script built), so it is not called
        loaded data; where it entered the update is all that is known."""
        rec = self.recorder
        if finding.details.get("origin") == "data" and rec.stood_aside and not rec.loaded_batch:
            finding.details["origin"] = "unrecorded"

    def _mark_carried(self, finding: Finding) -> None:
        """A non-finite model input that the model itself returned at the previous step — which
        was non-finite — is state the script carries across steps (an RNN's ``hidden``), not data:
        no batch can be dropped for it and a rollback does not reset it."""
        history = self.controller.history
        prev = history[-1] if len(history) else None
        if prev is None or prev.finite:
            return
        bad = [t for t in carried_inputs(self.recorder) if not bool(torch.isfinite(t).all())]
        if not bad:
            return
        first = next((f for f, _ in self.controller.findings), None)
        finding.details["origin"] = "carried"
        finding.details["carried_from_step"] = prev.step
        if first is not None:
            finding.details["first_event"] = {"step": first.step, "op": first.op, "module": first.module,
                                              "phase": first.phase}
        finding.details["note"] = (
            f"this input is what the model returned at step {prev.step} (non-finite then), passed back "
            "in by the script: state carried across steps, which a rollback does not reset")

    def watch_finding(self, chk: NormCheck, params: Sequence[torch.Tensor], step: int) -> Finding:
        """What the fused check itself saw: the first non-finite gradient, or the loss."""
        names = self.watch.param_names()
        bad = [params[i] for i in chk.bad if i < len(params)]
        if bad and all(math.isfinite(v) for v in chk.losses):  # a non-finite loss came first
            g = bad[0].grad
            assert g is not None
            pnames = [names.get(id(p), "?") for p in bad]
            return finding_for(
                g, "backward", None, module=module_of(pnames[0]), step=step,
                reached="gradients", detected_by="watch", details={"gradients": pnames},
            )
        return finding_for(
            None, "forward", None, step=step, reached="loss", detected_by="watch",
            details={"losses": [v if math.isfinite(v) else str(v) for v in chk.losses]},
        )

    def optimizer_finding(self, opt: torch.optim.Optimizer, pchk: NormCheck, step: int,
                          wnames: Sequence[str], pending: NormCheck | None) -> Finding:
        """The weights (or the optimizer state) were finite before ``step``'s update and are not
        after it. The update is replayed op by op when a copy from before it was affordable."""
        weights, _ = self.watch.weights(opt)
        badn = [wnames[i] for i in pchk.bad if i < len(wnames)]
        first = weights[pchk.bad[0]] if pchk.bad else weights[0]
        params = [n for n in badn if ":" not in n]
        state = [n for n in badn if ":" in n]
        finding = self.updates.run(opt, step, self.model, self.modules)
        if finding is None:
            loc = user_frame(2)
            finding = finding_for(
                first, "optimizer", f"{type(opt).__name__}.step",
                source=loc.short if loc else None, source_code=loc.code if loc else None,
                step=step, reached="parameters" if params else "optimizer state", detected_by="watch",
                details={"note": "the op inside the optimizer step was not replayed (a copy of the "
                         "state before each step costs too much here); nanguard run --trace names it"},
            )
        if finding.module is None:
            finding.module = module_of((params or state or ["?"])[0])
        finding.rank = _dist.rank() if _dist.active() else None
        finding.details.setdefault("parameters", params)
        if state:
            finding.details["optimizer_state"] = state
        history = self.controller.history
        rec = next((r for r in reversed(history.last(3)) if r.step == step), None)
        # checked after the update: the step's record holds its gradients
        finding.details["grads_finite"] = rec.finite if rec is not None else (pending is None or pending.finite)
        gn = rec.grad_norm if rec is not None else (pending.norm if pending else None)
        if gn is not None:
            finding.details["grad_norm"] = gn
        return finding

    def _weights_came_in(self, step: int, collective: str) -> Finding | None:
        """The replay stopped before a collective (a tensor-parallel all-reduce in the forward):
        were the weights this step read already non-finite? (each rank's own shard; read only
        now, after a failure). A weight the last update left finite and the forward found
        non-finite was written between the steps — the finding says so rather than blaming an
        op the replay could not reach."""
        names = self.watch.param_names()
        bad = [p for p in self.watch.params() if not bool(torch.isfinite(local(p).detach()).all())]
        if not bad:
            return None
        badn = [names.get(id(p), "?") for p in bad]
        return finding_for(
            local(bad[0]).detach(), "forward", "parameter", module=module_of(badn[0]), step=step,
            reached="parameters", detected_by="watch", rank=_dist.rank() if _dist.active() else None,
            details={"origin": "parameter", "parameters": badn,
                     "note": (f"the weights were already non-finite when this step began (the replay stopped "
                              f"before `{collective}`, a collective, so no op of the step was re-run): "
                              "written between the steps, or by an update not checked after it")},
        )

    def script_write(self, pchk: NormCheck, weights: Sequence[torch.Tensor]) -> str | None:
        """Policy ``raise``, the weights found non-finite at this step's check: did the script
        itself touch one of them since the last update — an op outside any module, recorded in
        this step's tape, with the weight among its arguments (``w[0, 1] = inf``, a corrupted
        slice loaded into it)? Its source line, or ``None``."""
        keys = {storage_key(weights[i]) for i in pchk.bad if i < len(weights)}
        for ev in self.recorder.events:
            if isinstance(ev, TapeOp) and ev.prelude is None and any(
                    storage_key(t) in keys for t in _flat([ev.args, ev.kwargs])):
                return ev.source.short if ev.source is not None else "?"
        return None

    def parameter_finding(self, pchk: NormCheck, wnames: Sequence[str], step: int,
                          note: str = "found before the first update: the weights came in non-finite") -> Finding:
        """Weights non-finite before the first update: they came in that way (or, ``note``, the
        script wrote them between two steps)."""
        primary = self.watch.primary
        weights, _ = self.watch.weights(primary) if primary is not None else ([], [])
        badn = [wnames[i] for i in pchk.bad if i < len(wnames)]
        first = weights[pchk.bad[0]] if pchk.bad and weights else None
        name0 = badn[0] if badn else "?"
        if not self.watch.state.updated:
            self.watch.state.bad_from_start.update(n.split(":")[0] for n in badn)
        return finding_for(
            first, "forward", "parameter", module=module_of(name0), step=step,
            reached="parameters", detected_by="watch", rank=_dist.rank() if _dist.active() else None,
            details={"origin": "parameter", "parameters": badn, "note": note},
        )
