"""Early warnings: a healthy run on a path to overflow, said before its first NaN.

Read after every step's history record (:meth:`~nanguard.core.controller.StepController.
step_ended`), from the scalars the watch keeps anyway — the loss, the gradient norm from before
the script's own clipping, the update/weight ratio, the weight norm — over the last few healthy
steps of the same optimizer. Nothing is measured for it: on a healthy step it costs a few
comparisons of numbers already in the history.

A warning needs growth that is both **fast and sustained**, the signature of divergence rather
than of a spike (an edge-of-stability run's loss jumps and comes back within a step or two):

* ``weights-growing`` — the weight norm grew ×1.25 or more at each of the last 3 steps, or ×3
  over two such steps, or ×4 in one (a healthy run's weights move by a fraction of a percent);
  or it grew at each of the last 20 steps, ×2 or more over them, at a rate that held (the newer
  half's ≥ 0.9 of the older half's: ×1.05 a step from step 0, a prior's sign flipped; said
  without a projected step, which the norm alone cannot give);
* ``gradients-growing`` — the gradient norm grew ×1.5 or more at each of the last 4 steps and
  ×10 or more over them, to above anything that optimizer's gradients reached before, in a rise
  longer than any burst of them the run came back from (up to 8 rises, ×10 over them, then back
  below the peak / √10 within 3 steps: a mixture density net's gradients, ∝ 1/σ², burst for 5
  steps every hundred and fall back — a burst like those is not the start of an explosion until
  it outlasts them);

  and for these two and the loss, the growth does not slow down over its window (the newer
  half's rate in logs ≥ 3/4 of the older half's): weights leaving a zero initialisation grow
  ×2, ×1.5, ×1.33 (linearly: learning, not divergence), and a loss that follows an RL agent's
  longer episodes saturates;
* ``updates-too-large`` — the update/weight ratio was 1 or more at each of the last 3 steps
  (healthy ≈ 1e-3: each update is as large as the weights themselves; an edge-of-stability
  run reaches 0.9 in its first steps);
* ``loss-diverging`` — the loss grew at each of the last 4 steps, ×10 or more over them, or
  ×10 or more at each of the last 3, to above every loss of the 50 healthy steps before and
  above the run's first loss (a loss bouncing near its floor, 0.002 → 0.15, is not heading
  for an overflow);
* ``low-precision-headroom`` — in a float16 model, the loss or the gradient norm came within ×4
  of float16's largest value (65504): the adapter says which dtype the weights are in;
* ``data-nonfinite`` — the data the run will read already holds a few NaN or Inf (a dataset's
  tensors when a ``DataLoader`` starts an epoch, the script's own tensors after its first step):
  the adapter looks once (``nanguard.torch._datapeek``) and hands over a :class:`NonFiniteData`;
  with a sequential sampler, the step whose batch holds the first one is projected;
* ``optimizer-eps-zero`` — an optimizer whose update divides by a root of its squared-gradient
  average plus ``eps`` (Adam and its kin, RMSprop, Adagrad, Adadelta) was given ``eps=0``: a
  weight whose gradient has been exactly 0 at every step so far gets 0/0 at its update. Told
  once, before the optimizer's first update (:func:`eps_zero`, called by the adapter when it
  first sees the optimizer);
  or, at the end of the first step, a regression loss compares a model's float16 output as it
  is to targets larger than 65504 (:func:`targets_beyond`): to fit them the output must
  overflow (raw salaries under ``torch.autocast``);
* ``latent-hazard`` — on two sampled early steps, an unsafe op on the path to the loss is risky
  by its margin or by a pattern whose singular point is in its domain (``log`` of a softmax,
  ``sqrt`` of a sum of squares): :func:`nanguard.core.hazards.early_warning`, found by the
  adapter (``nanguard.torch._hazard_watch``).

Each comes with its evidence and, for a geometric growth, the step float32 overflows at if the
rate holds. A kind is warned about once per run (a recovery resets nothing); printing is the
caller's (``nanguard run`` and ``attach`` print on stderr; the run log lists them all).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .history import History, StepRecord
from .ops import DTYPE_MAX

__all__ = ["KINDS", "EarlyWarning", "EarlyWarnings", "NonFiniteData", "eps_zero", "projection", "targets_beyond"]

KINDS = ("weights-growing", "gradients-growing", "updates-too-large", "loss-diverging",
         "low-precision-headroom", "data-nonfinite", "latent-hazard", "optimizer-eps-zero")
#: the weight norm grew ×1.25 or more at each of the last k steps and this much over them
WEIGHT_GROWTH, WEIGHT_TOTAL = 1.25, {1: 4.0, 2: 3.0, 3: 1.25 ** 3}
#: or, slowly: it grew at each of the last 20 steps, ×2 or more over them, at a rate that held
#: (:data:`SUSTAINED_SLOW`: linear growth over a doubling scores 0.71, geometric 1)
WEIGHT_SLOW_STEPS, WEIGHT_SLOW_TOTAL, SUSTAINED_SLOW = 20, 2.0, 0.9
HEADROOM = 4.0  # a float16 loss or gradient norm within this factor of 65504
GRAD_GROWTH, GRAD_STEPS, GRAD_TOTAL = 1.5, 4, 10.0
#: a burst the run came back from: at most this many rises, ×10 over them, then the norm back
#: below its peak / √10 within this many steps (a slow climb, or a pause in one, is none)
GRAD_BURST_STEPS, GRAD_BURST_BACK = 8, 3
RATIO_HIGH, RATIO_STEPS = 1.0, 3
LOSS_STEPS, LOSS_TOTAL, LOSS_CONTEXT = 4, 10.0, 50
#: or ×10 or more at each of the last 3 steps (×1000 over them): a step sooner
LOSS_FAST, LOSS_FAST_STEPS = 10.0, 3
#: a growth is sustained when its rate over the newer half of the window is at least this part
#: of its rate over the older half (in logs): geometric or accelerating growth, not a quantity
#: leaving zero linearly (×2, ×1.5, ×1.33: 0.41) or a curve that saturates
SUSTAINED = 0.75


@dataclass
class EarlyWarning:
    """One warning: the step it was raised at, its kind, a sentence and its numbers."""

    step: int
    kind: str
    message: str
    evidence: list[str] = field(default_factory=list)
    projected_step: int | None = None  # where float32 overflows if the growth holds

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "kind": self.kind, "message": self.message,
                "evidence": list(self.evidence), "projected_step": self.projected_step}

    def line(self) -> str:
        """The line printed on stderr."""
        ahead = projection(self.kind, self.projected_step)
        when = f"; {ahead}" if ahead else ""
        return f"nanguard: warning at step {self.step} ({self.kind}): {self.message}{when}"


@dataclass
class NonFiniteData:
    """Non-finite values found in one tensor, array or list of per-sample tensors of the data."""

    name: str  # ``TabularDataset.x``, ``x_all`` …
    what: str  # ``float32[600, 10]``, ``list of 1000 Tensors``
    nan: int
    inf: int
    rows: int  # entries along the first dimension (samples) holding one
    first_row: int
    total_rows: int

    def warning(self, step: int, where: str, projected_step: int | None = None) -> EarlyWarning:
        """The warning, raised at ``step``; ``where``: "a dataset" or "the script's variables"."""
        bad = " and ".join(f"{n} {k}" for n, k in ((self.nan, "NaN"), (self.inf, "Inf")) if n)
        msg = (f"`{self.name}` ({where}) holds {bad} in {self.rows} of its {self.total_rows} rows "
               f"(first: row {self.first_row}): a batch that reads one gives a non-finite loss "
               "unless the script masks it")
        return EarlyWarning(step, "data-nonfinite", msg,
                            [f"{self.name}: {self.what}, {bad}, first in row {self.first_row}"],
                            projected_step)


def eps_zero(call: str, groups: Sequence[int], n_groups: int, step: int) -> EarlyWarning:
    """The ``optimizer-eps-zero`` warning: ``call`` is how the script made the optimizer
    (``torch.optim.Adam(eps=0)``), ``groups`` the parameter groups whose ``eps`` is 0."""
    which = "" if len(groups) == n_groups else (
        f" (parameter group{'s' if len(groups) > 1 else ''} {', '.join(map(str, groups))})")
    msg = (f"`{call}`{which}: its update divides by the root of the squared-gradient average "
           "plus eps, so a weight whose gradient has been exactly 0 at every step so far (an "
           "embedding row never looked up, a dead ReLU unit, a masked output) gets 0/0 = NaN at "
           "its update; keep eps at its default (1e-8 for Adam, 1e-7 in Keras) or above")
    return EarlyWarning(step, "optimizer-eps-zero", msg, [f"{call}: eps = 0"])


def targets_beyond(step: int, dtype: str, top: float, targets: float, loss: str, model: str,
                   autocast: bool) -> EarlyWarning:
    """The ``low-precision-headroom`` warning of a regression whose targets (largest
    ``|y|`` = ``targets``, in the first batch) are beyond the largest value ``top`` of the
    ``dtype`` its model outputs (``autocast``: the weights are float32, the output low-precision
    because of ``torch.autocast``), compared as it is by the ``loss``; said at ``step``."""
    how = f"under torch.autocast({dtype})" if autocast else f"its weights are {dtype}"
    return EarlyWarning(
        step, "low-precision-headroom",
        f"the regression targets reach {targets:.3g}, beyond {dtype}'s largest value {top:g}, and "
        f"{loss} compares them to the {dtype} output of `{model}` as it is ({how}): to fit them "
        f"that output must overflow — scale the targets (standardise them, or divide by "
        f"{10 ** math.ceil(math.log10(targets / top * 10)):g}) or compute the output layer in float32",
        [f"largest |target| of the first batch: {targets:.4g}; {dtype}'s largest value: {top:g}",
         f"the loss: {loss}; `{model}` returns {dtype} ({how})"])


def projection(kind: str | None, step: int | None) -> str:
    """What a warning's projected step means, in words ("" without one)."""
    if step is None:
        return ""
    if kind == "data-nonfinite":
        return f"the loader reaches it at step {step}"
    if kind == "margin-shrinking":
        return ""  # its message says where its margin reaches the edge
    return f"at this rate float32 overflows at step ~{step}"


def _recent(history: History, n: int) -> list[StepRecord]:
    """The newest ``n`` healthy records of the newest record's optimizer, oldest first."""
    newest = history[-1]
    out: list[StepRecord] = []
    for rec in history.newest(4 * n + 8):
        if rec.optimizer == newest.optimizer and rec.finite and not rec.skipped:
            out.append(rec)
            if len(out) == n:
                break
    return out[::-1]


def _known(recs: list[StepRecord], name: str) -> list[StepRecord]:
    """``recs`` without a newest record whose ``name`` is not known yet (under ``raise`` the
    weights an update left are read with the next step's check, and filled in then)."""
    while recs and getattr(recs[-1], name) is None:
        recs = recs[:-1]
    return recs


def _values(recs: Sequence[StepRecord], name: str) -> list[float] | None:
    vals = [getattr(r, name) for r in recs]
    if any(v is None or not math.isfinite(v) or v <= 0 for v in vals):
        return None
    return [float(v) for v in vals]


def _grew(before: float | None, after: float | None, factor: float) -> bool:
    """``after`` is finite, positive and more than ``factor`` × ``before``."""
    return (before is not None and after is not None and before > 0 and math.isfinite(after)
            and after > factor * before)


def _top_before(history: History, tail: list[StepRecord], name: str) -> float | None:
    """The largest finite ``name`` of the healthy steps of ``tail``'s optimizer before ``tail``
    (the whole history kept: asked only once a rule's growth has fired)."""
    opt, first = tail[-1].optimizer, tail[0].step
    vals = [v for r in history.healthy() if r.optimizer == opt and r.step < first
            and (v := getattr(r, name)) is not None and math.isfinite(v)]
    return max(vals) if vals else None


def _ratios(vals: list[float]) -> list[float]:
    return [b / a for a, b in itertools.pairwise(vals)]


def _sustained(ratios: list[float], part: float = SUSTAINED) -> bool:
    """The growth ``ratios`` (each > 1) do not slow down: the newer half's mean log-rate is at
    least ``part`` × the older half's (one ratio alone is sustained)."""
    h = len(ratios) // 2
    if h == 0:
        return True
    older = math.fsum(math.log(r) for r in ratios[:h]) / h
    newer = math.fsum(math.log(r) for r in ratios[-h:]) / h
    return newer >= part * older


def _overflow_step(step: int, value: float, rate: float, power: float = 1.0) -> int | None:
    """The step ``value`` growing ×``rate`` a step reaches float32's largest value; ``power``:
    what overflows grows as ``value ** power`` (a loss quadratic in the weights)."""
    if rate <= 1.0 or value <= 0:
        return None
    return step + max(1, math.ceil(math.log(DTYPE_MAX["float32"] / value) / (power * math.log(rate))))


class EarlyWarnings:
    """The warnings of one run, read from its history after each step."""

    def __init__(self, on_warning: Callable[[EarlyWarning], None] | None = None) -> None:
        self.warnings: list[EarlyWarning] = []
        #: the largest value of the weights' dtype when it is a low-precision one (float16:
        #: 65504), set by the adapter; ``None`` for float32 and wider
        self.low_max: float | None = None
        self.low_dtype = "float16"
        self._loss_rises = 0  # consecutive steps the loss rose, up to the newest
        self._first_loss: float | None = None  # the run's first finite loss
        self._weight_rises = 0  # consecutive steps the (known) weight norm rose
        self._weight_seen = -1  # the step of the newest weight norm counted
        #: per optimizer: the gradient norm's current run of rises (its length and the norm it
        #: rose from) and the longest earlier run of rises ×10 or more it came back from
        self._grad_rise: dict[str | None, tuple[int, float]] = {}
        self._grad_burst: dict[str | None, int] = {}
        #: a run of rises that ended ×10 up, waiting to come back: (its length, its peak, the
        #: steps it has left to)
        self._grad_cand: dict[str | None, tuple[int, float, int]] = {}
        self._last_seen = -1
        self.on_warning = on_warning
        self._said: set[str] = set()
        #: the run met its first non-finite value: a warning now would come after the finding
        #: it should have preceded (a hazard sampled at the step that fired, a rule read after
        #: a skip), so none is said
        self.closed = False

    def close(self) -> None:
        """The run's first non-finite step is being handled (called by the controller)."""
        self.closed = True

    def observe(self, history: History) -> list[EarlyWarning]:
        """After the step's record: the warnings it raised (each kind once per run)."""
        if (self.closed or not len(history) or not history[-1].finite
                or len(self._said) == len(KINDS)):
            return []
        if not self._may_warn(history):
            return []  # nothing grew at the newest step: the usual case, a few comparisons
        recs = _recent(history, LOSS_STEPS + 1)
        new = [w for w in (self._weights(recs) or self._weights_slowly(history), self._gradients(history, recs),
                           self._updates(recs), self._loss(history, recs), self._headroom(recs))
               if w is not None and w.kind not in self._said]
        return [w for w in new if self.add(w)]

    def add(self, w: EarlyWarning) -> bool:
        """A warning the adapter found itself (the data look): said unless its kind was, or
        the run has already met a non-finite value."""
        if w.kind in self._said or self.closed:
            return False
        self._said.add(w.kind)
        self.warnings.append(w)
        if self.on_warning is not None:
            self.on_warning(w)
        return True

    def _may_warn(self, history: History) -> bool:
        """Could any rule fire now? Each needs the newest step (or, for the weights, the newest
        step whose weights are known) to have grown, and the loss rule four rises in a row —
        counted here, one comparison a step."""
        newest = history[-1]
        # the two newest earlier records of this optimizer's healthy steps, in one pass
        prev = older = None
        for r in itertools.islice(history.newest(8), 1, None):
            if r.optimizer == newest.optimizer and r.finite and not r.skipped:
                if prev is None:
                    prev = r
                else:
                    older = r
                    break
        if self._first_loss is None and newest.loss is not None and math.isfinite(newest.loss):
            self._first_loss = max(0.0, newest.loss)
        if prev is not None and newest.step != self._last_seen:  # once per step, however often asked
            self._last_seen = newest.step
            rose = _grew(prev.loss, newest.loss, 1.0)
            self._loss_rises = self._loss_rises + 1 if rose else 0
            self._count_grad_rise(prev, newest)
        if prev is None:
            return False
        w_new, w_old = (newest, prev) if newest.param_norm is not None else (prev, older)
        if w_old is not None and w_new.step != self._weight_seen:
            self._weight_seen = w_new.step
            up = _grew(w_old.param_norm, w_new.param_norm, 1.0)
            self._weight_rises = self._weight_rises + 1 if up else 0
        return (self._loss_rises >= LOSS_FAST_STEPS
                or self._weight_rises >= WEIGHT_SLOW_STEPS
                or (w_old is not None and _grew(w_old.param_norm, w_new.param_norm, WEIGHT_GROWTH))
                or _grew(prev.grad_norm, newest.grad_norm, GRAD_GROWTH)
                or (w_new.update_ratio or 0.0) >= RATIO_HIGH
                or (self.low_max is not None and max(abs(newest.loss or 0.0), newest.grad_norm or 0.0)
                    >= self.low_max / HEADROOM))

    def _count_grad_rise(self, prev: StepRecord, newest: StepRecord) -> None:
        """The gradient norm's run of rises, once a step (a skipped step or one without a norm
        changes nothing). A run of at most :data:`GRAD_BURST_STEPS` rises that ended ×10 or more
        above where it began, and whose norm then fell to within √10 of that start's scale —
        below its peak / √10 — within :data:`GRAD_BURST_BACK` steps, is a burst the run came back
        from: its length is kept, per optimizer (a slow climb, or one that only paused, is not)."""
        g = newest.grad_norm
        if newest.skipped or g is None or not math.isfinite(g):
            return
        opt = newest.optimizer
        cand = self._grad_cand.pop(opt, None)
        if cand is not None:
            n, peak, left = cand
            if g <= peak / math.sqrt(GRAD_TOTAL):
                self._grad_burst[opt] = max(n, self._grad_burst.get(opt, 0))
            elif left > 1:
                self._grad_cand[opt] = (n, peak, left - 1)
        n, start = self._grad_rise.get(opt, (0, 0.0))
        if _grew(prev.grad_norm, g, 1.0):
            self._grad_rise[opt] = (n + 1, start if n else float(prev.grad_norm or 0.0))
            return
        top = prev.grad_norm
        if 0 < n <= GRAD_BURST_STEPS and start > 0 and top is not None and top >= GRAD_TOTAL * start:
            if g <= top / math.sqrt(GRAD_TOTAL):  # already back at its first fall
                self._grad_burst[opt] = max(n, self._grad_burst.get(opt, 0))
            else:
                self._grad_cand[opt] = (n, top, GRAD_BURST_BACK)
        self._grad_rise[opt] = (0, 0.0)

    # --- the rules -------------------------------------------------------------------------------
    def _weights(self, recs: list[StepRecord]) -> EarlyWarning | None:
        recs = _known(recs, "param_norm")
        for k, total in WEIGHT_TOTAL.items():
            tail = recs[-(k + 1):]
            vals = _values(tail, "param_norm") if len(tail) == k + 1 else None
            if (vals is not None and min(_ratios(vals)) >= WEIGHT_GROWTH
                    and vals[-1] / vals[0] >= total and _sustained(_ratios(vals))):
                return self._weights_warning(tail, vals, k)
        return None

    def _weights_slowly(self, history: History) -> EarlyWarning | None:
        """Steady growth below the fast rules: ×1.05 a step from step 0 overflows within ~1,800
        steps of a norm of 1, and sooner in what the weights feed (``exp(w)``, ``w**2``): said
        without a projection, which the norm alone cannot make."""
        if self._weight_rises < WEIGHT_SLOW_STEPS or "weights-growing" in self._said:
            return None
        tail = _known(_recent(history, WEIGHT_SLOW_STEPS + 2), "param_norm")[-(WEIGHT_SLOW_STEPS + 1):]
        vals = _values(tail, "param_norm") if len(tail) == WEIGHT_SLOW_STEPS + 1 else None
        # steady: not slowing (linear, √t), and not one jump at its end (the fast rules' case)
        if (vals is None or min(_ratios(vals)) <= 1.0 or vals[-1] / vals[0] < WEIGHT_SLOW_TOTAL
                or not _sustained(_ratios(vals), SUSTAINED_SLOW)
                or not _sustained(_ratios(vals)[::-1], 0.5)):
            return None
        rate, step = (vals[-1] / vals[0]) ** (1 / WEIGHT_SLOW_STEPS), tail[-1].step
        return EarlyWarning(step, "weights-growing",
                            f"the weight norm grew at each of the last {WEIGHT_SLOW_STEPS} steps, "
                            f"×{vals[-1] / vals[0]:.3g} over them (×{rate:.3g} a step, not slowing: "
                            f"{vals[0]:.3g} → {vals[-1]:.3g})",
                            [f"|w| at steps {tail[0].step}–{step}: "
                             + ", ".join(f"{v:.3g}" for v in vals[::4])
                             + ("" if WEIGHT_SLOW_STEPS % 4 == 0 else f", {vals[-1]:.3g}")])

    def _weights_warning(self, tail: list[StepRecord], vals: list[float], k: int) -> EarlyWarning:
        rate = (vals[-1] / vals[0]) ** (1 / k)
        step = tail[-1].step
        run = f"a step for {k} steps" if k > 1 else "in one step"
        return EarlyWarning(step, "weights-growing",
                            f"the weight norm grew ×{rate:.3g} {run} ({vals[0]:.3g} → {vals[-1]:.3g})",
                            [f"|w| at steps {tail[0].step}–{step}: " + ", ".join(f"{v:.3g}" for v in vals)],
                            _overflow_step(step, vals[-1], rate))

    def _gradients(self, history: History, recs: list[StepRecord]) -> EarlyWarning | None:
        tail = recs[-(GRAD_STEPS + 1):]
        vals = _values(tail, "grad_norm") if len(tail) == GRAD_STEPS + 1 else None
        if (vals is None or min(_ratios(vals)) < GRAD_GROWTH or vals[-1] / vals[0] < GRAD_TOTAL
                or not _sustained(_ratios(vals))):
            return None
        top = _top_before(history, tail, "grad_norm")
        if top is not None and vals[-1] <= top:
            # no higher than this optimizer's gradients have been in the run: a burst of a
            # heavy-tailed gradient (a mixture density net's 1/σ²) that came back before
            return None
        opt = tail[-1].optimizer
        if self._grad_rise.get(opt, (0, 0.0))[0] <= self._grad_burst.get(opt, 0):
            return None  # no longer than a burst of this optimizer's gradients the run came back from
        rate = (vals[-1] / vals[0]) ** (1 / GRAD_STEPS)
        step = tail[-1].step
        return EarlyWarning(step, "gradients-growing",
                            f"the gradient norm (before any clipping) grew ×{rate:.3g} a step for "
                            f"{GRAD_STEPS} steps ({vals[0]:.3g} → {vals[-1]:.3g})",
                            [f"|g| at steps {tail[0].step}–{step}: " + ", ".join(f"{v:.3g}" for v in vals)],
                            _overflow_step(step, vals[-1], rate))

    def _updates(self, recs: list[StepRecord]) -> EarlyWarning | None:
        tail = _known(recs, "param_norm")[-RATIO_STEPS:]
        ratios = [r.update_ratio for r in tail]
        if len(tail) < RATIO_STEPS or any(q is None or not q >= RATIO_HIGH for q in ratios):
            return None
        step = tail[-1].step
        shown = ", ".join(f"{q:.3g}" for q in ratios if q is not None)
        lr = tail[-1].lr
        return EarlyWarning(step, "updates-too-large",
                            f"each of the last {RATIO_STEPS} updates changed the weights by "
                            f"{min(q for q in ratios if q is not None):.2g}× their norm or more "
                            "(healthy ≈ 1e-3)" + (f" at lr {lr:.3g}" if lr is not None else ""),
                            [f"update/weight ratio at steps {tail[0].step}–{step}: {shown}"])

    def _headroom(self, recs: list[StepRecord]) -> EarlyWarning | None:
        top = self.low_max
        if top is None or not recs:
            return None
        rec = recs[-1]
        for name, what in (("loss", "the loss"), ("grad_norm", "the gradient norm")):
            v = getattr(rec, name)
            if v is not None and math.isfinite(v) and abs(v) >= top / HEADROOM:
                return EarlyWarning(rec.step, "low-precision-headroom",
                                    f"{what} {abs(v):.3g} is within ×{top / abs(v):.2g} of "
                                    f"{self.low_dtype}'s largest value {top:g}",
                                    [f"{name} at step {rec.step}: {v:.3g}; the weights are {self.low_dtype}"])
        return None

    def _loss(self, history: History, recs: list[StepRecord]) -> EarlyWarning | None:
        for k, each, total in ((LOSS_FAST_STEPS, LOSS_FAST, LOSS_FAST ** LOSS_FAST_STEPS),
                               (LOSS_STEPS, 1.0, LOSS_TOTAL)):
            tail = recs[-(k + 1):]
            vals = _values(tail, "loss") if len(tail) == k + 1 else None
            if (vals is not None and min(_ratios(vals)) > each and vals[-1] / vals[0] >= total
                    and _sustained(_ratios(vals))):
                return self._loss_warning(history, tail, vals, k)
        return None

    def _loss_warning(self, history: History, tail: list[StepRecord], vals: list[float],
                      k: int) -> EarlyWarning | None:
        before = history.series("loss", LOSS_CONTEXT + k + 1)[:-(k + 1)]
        if before and vals[-1] <= max(before):
            return None  # no higher than the run has been: a spike it came back from before
        if self._first_loss is not None and vals[-1] <= self._first_loss:
            return None  # below where the run started: a loss bouncing near its floor
        rate = (vals[-1] / vals[0]) ** (1 / k)
        step = tail[-1].step
        return EarlyWarning(step, "loss-diverging",
                            f"the loss grew at each of the last {k} steps, ×{rate:.3g} a step "
                            f"({vals[0]:.4g} → {vals[-1]:.4g}), above anything since step "
                            f"{max(tail[0].step - LOSS_CONTEXT, history[0].step)}",
                            [f"loss at steps {tail[0].step}–{step}: " + ", ".join(f"{v:.4g}" for v in vals)],
                            _overflow_step(step, vals[-1], rate))
