"""Latent hazards: unsafe ops that have not made a NaN yet, with their margin to the singularity.

An adapter's check (torch: :class:`nanguard.torch.hazards.HazardMode`) runs the first steps of
a script and calls :meth:`HazardBook.observe` for every unsafe op whose result reaches the loss
(grad enabled and an input on the autograd graph; optimizer-phase and ``no_grad`` ops are
ignored: Adam's ``sqrt`` sees 3e-17 and an accuracy metric divides by 1e-10 every step, and
neither is a bug). What is kept per op and source line:

* the **margin**, step by step: the smallest input of a ``log`` / ``sqrt`` / ``rsqrt`` / a
  divisor (distance to the singularity at 0), ``1 - max |x|`` of an ``acos`` / ``asin`` /
  ``atanh`` (distance to the edge of the domain, kind ``edge``), the e-folds left before an
  ``exp`` overflows (``ln(max) - max input``), the headroom of a float16/bfloat16 result
  (``max / max |x|``);
* the **pattern** it was made by, when a stable form exists: ``log`` of a softmax or a sigmoid
  (``1 - sigmoid`` can jump from 1.2e-7 to exactly 0), ``log(exp(x) + 1)``, ``sqrt`` of a sum of
  squares (its gradient is infinite at 0), a hand-written softmax, a division by a sum or a
  ``rsqrt`` of a variance without ``eps``, an ``acos`` / ``asin`` not clamped inside ±1 (a
  cosine rounds past 1, and the gradient is infinite at 1);
* for a **recurrence** (a module fed its own output, kind ``recurrence``), the length of the
  chain of calls at which the gradient, growing per call going back at the rate measured,
  passes the dtype's largest value: high at :data:`RECURRENCE_EDGE` calls or fewer.

An op the adapter saw on data only (its result met the graph later) and on just one of several
steps is left out of the ranking: it prepared the data once, at start-up.

Patterns and margins are judged separately, each with its reason (:func:`assess`): a margin
within reach of the singularity is ``high`` risk, a pattern with a stable form ``medium``, an
unsafe op with a wide margin and no pattern ``low`` (listed, not risky). Measured on programs
with latent bugs (see the issue behind this module): a ``log`` input within 1e-6 of 0 or
subnormal flagged every real case that later fired; ``exp`` and ``sqrt`` margins did not
separate bugs from ordinary code, their patterns did — so those two are ranked by pattern, and
by margin only at the very edge.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from .early import EarlyWarning
from .ops import DTYPE_MAX

__all__ = ["RISKY", "Hazard", "HazardBook", "Key", "assess", "early_warning", "hazard_lines", "trend_warning"]

#: a log/sqrt/divisor input this close to 0 is one small step from the singularity
NEAR_ZERO = 1e-6
#: the smallest normal number of each dtype: below it a value is one underflow from exactly 0
TINY = {"float16": 6.1e-05, "bfloat16": 1.18e-38, "float32": 1.18e-38, "float64": 2.2e-308}
#: the largest finite value of each dtype: the one table, :data:`nanguard.core.ops.DTYPE_MAX`
MAX = DTYPE_MAX
#: an exp with fewer e-folds than this left before overflow (e^10 ≈ 2e4)
EXP_EDGE = 10.0
#: a float16/bfloat16 result within this factor of the dtype's largest value
HEADROOM_EDGE = 4.0
HEADROOM_WATCH = 64.0
#: margins shrinking by this factor or more over the steps checked are "shrinking"
SHRINK = 10.0
#: a shrinking margin projected to reach its edge within this many times the steps checked
PROJECT = 20
#: a recurrence whose gradient overflows within a chain of this many calls: sequence lengths in
#: common use (a BPTT window, a sentence of tokens, a clip of frames) reach it
RECURRENCE_EDGE = 512
#: a margin's trend over the run (the watch's later sampled steps) is fitted on this many of
#: its newest sampled steps, and the fit one sample older must hold too
TREND_SAMPLES = 4
#: ... each fit a least-squares line that explains the margins this well (R²)
TREND_FIT = 0.95
#: ... and the newer projection may lie later than the older by at most this share of the
#: distance still ahead (a saturating curve's projection recedes at every sample)
TREND_DRIFT = 0.5
#: a projection further ahead than this many steps waits for the next samples
TREND_HORIZON = 100
RISKY = ("high", "medium")
_ORDER = {"high": 0, "medium": 1, "low": 2}


@dataclass
class Hazard:
    """One unsafe op at one source line, over the steps checked."""

    op: str  # log, sqrt, rsqrt, div, exp, float16 ...
    #: "zero" (singularity at 0), "edge" (acos/asin: ±1), "overflow" (exp), "headroom" (low
    #: precision), "masked" (a softmax over masked scores: its margin the fewest unmasked
    #: positions), "recurrence" (the gradient growing back through a module fed its own output:
    #: its margin the chain of calls at which it overflows)
    kind: str
    source: str | None
    source_code: str | None
    module: str | None
    dtype: str
    pattern: str | None = None
    stable_form: str | None = None
    margins: dict[int, float] = field(default_factory=dict)  # step -> the step's worst margin
    calls: int = 0
    guarded: bool = False  # its input was made with a floor (+ eps, a positive clamp)
    pattern_edge: float | None = None  # the pattern is risky at or below this margin (None: always)
    data_only: bool = True  # every call computed on data only (its result met the graph later)
    risk: str = "low"
    reasons: list[str] = field(default_factory=list)

    @property
    def margin(self) -> float:
        """The worst margin seen over all steps (smallest)."""
        return min(self.margins.values()) if self.margins else math.inf

    def _thirds(self) -> tuple[float, float, float] | None:
        """(median margin of the first third of the steps, of the last third, steps between
        their middles): a trend that one noisy step (a batch's smallest count) does not make."""
        if len(self.margins) < 6:
            return None
        steps = sorted(self.margins)
        k = len(steps) // 3
        first = sorted(self.margins[s] for s in steps[:k])[k // 2]
        last = sorted(self.margins[s] for s in steps[-k:])[k // 2]
        return first, last, max(steps[-k:][k // 2] - steps[:k][k // 2], 1)

    @property
    def shrink(self) -> float | None:
        """How many times the margin shrank from the first third of the steps checked to the
        last (medians; ``None`` with fewer than 6 steps). For ``exp`` the e-folds left."""
        t = self._thirds()
        if t is None:
            return None
        first, last, _ = t
        if last <= 0:
            return math.inf
        return first / last

    @property
    def projected(self) -> int | None:
        """Steps after the last one checked until the margin reaches its edge (1e-6 of 0, or
        :data:`EXP_EDGE` e-folds), at the rate it shrank over the steps checked (geometric for a
        distance to 0, linear for e-folds); ``None`` when it is not shrinking."""
        t = self._thirds()
        if t is None or self.kind in ("headroom", "masked", "recurrence"):
            return None
        first, last, n = t
        if self.kind == "overflow":
            rate = (first - last) / n
            return math.ceil((last - EXP_EDGE) / rate) if rate > 0 and last > EXP_EDGE else None
        if not (0 < last < first) or last <= NEAR_ZERO:
            return None
        rate = math.log(first / last) / n
        return math.ceil(math.log(last / NEAR_ZERO) / rate)

    def to_dict(self) -> dict[str, Any]:
        shrink = self.shrink
        return {
            "op": self.op, "kind": self.kind, "risk": self.risk, "source": self.source,
            "source_code": self.source_code, "module": self.module, "dtype": self.dtype,
            "pattern": self.pattern, "stable_form": self.stable_form,
            "margin": _num(self.margin), "first_margin": _num(self.margins[min(self.margins)]) if self.margins
            else None, "shrink": _num(shrink) if shrink is not None else None,
            "steps": len(self.margins), "calls": self.calls, "guarded": self.guarded,
            "projected_steps": self.projected, "data_only": self.data_only, "reasons": list(self.reasons),
        }


def _num(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


Key = tuple[str, str | None, str | None]  # (op, source line, module)


class HazardBook:
    """Every hazard seen, keyed by (op, source line, module); filled in by an adapter."""

    def __init__(self) -> None:
        self.hazards: dict[Key, Hazard] = {}
        self.steps = 0
        #: the run's step being looked at, where the adapter samples steps of a run (the watch);
        #: ``None``: every step is looked at, counted by ``steps`` (``nanguard check``)
        self.at: int | None = None

    @property
    def now(self) -> int:
        """The step the margins seen now belong to."""
        return self.steps if self.at is None else self.at

    def observe(self, op: str, kind: str, margin: float, *, step: int, dtype: str,
                source: str | None, source_code: str | None, module: str | None,
                pattern: str | None = None, stable_form: str | None = None,
                guarded: bool = False, pattern_edge: float | None = None, data_only: bool = False) -> Key:
        """An unsafe op ran at ``step`` with this ``margin`` (called by the adapter's mode);
        the hazard's key. ``data_only``: its inputs were data only (nothing required grad), and
        its result reached an op on the autograd graph afterwards."""
        key = (op, source, module)
        h = self.hazards.get(key)
        if h is None:
            h = self.hazards[key] = Hazard(op, kind, source, source_code, module, dtype)
        h.calls += 1
        h.guarded = h.guarded or guarded
        h.data_only = h.data_only and data_only
        if pattern and (not h.pattern or margin < h.margin):  # said with the worst margin
            h.pattern, h.stable_form, h.pattern_edge = pattern, stable_form, pattern_edge
        prev = h.margins.get(step)
        h.margins[step] = margin if prev is None else min(prev, margin)
        return key

    def set_pattern(self, key: Key, pattern: str, stable_form: str) -> None:
        """A pattern found later, at a consumer (a hand-written softmax, seen at its division,
        is the ``exp``'s hazard)."""
        h = self.hazards.get(key)
        if h is not None and not h.pattern:
            h.pattern, h.stable_form = pattern, stable_form

    def ranked(self) -> list[Hazard]:
        """The hazards, assessed and ordered by risk, then by margin. A data-only op seen on one
        step of several is left out: it prepared the data once (a dataset normalised at start-up),
        it is not part of the step."""
        out = [assess(h) for h in self.hazards.values()
               if not (h.data_only and len(h.margins) < 2 <= self.steps)]
        out.sort(key=lambda h: (_ORDER[h.risk], 0 if h.pattern else 1, h.margin))
        return out


def _overflow(dtype: str, m: float) -> tuple[str, str]:
    """An ``exp``'s risk and reason from its e-folds left (``m``; not positive: it overflowed)."""
    if m <= 0:
        return "high", f"its input passed ln({dtype} max): it overflowed to inf there"
    if m < EXP_EDGE:
        return "high", f"{m:.1f} e-folds left before {dtype} overflows (< {EXP_EDGE:g})"
    return "low", f"{m:.1f} e-folds left before {dtype} overflows"


def assess(h: Hazard) -> Hazard:
    """Set ``h.risk`` and ``h.reasons`` from its margin and its pattern, judged separately."""
    reasons: list[str] = []
    risk = "low"
    m = h.margin
    tiny = TINY.get(h.dtype, 1.18e-38)
    if h.kind == "zero" and h.guarded and m >= tiny:
        reasons.append(f"smallest input {m:.3g}, guarded: it was made with a floor (+ eps, a clamp)")
    elif h.kind == "zero":
        if m == 0:
            risk = "high"
            reasons.append(f"its input reached exactly 0: `{h.op}` is at its singularity there")
        elif m < tiny:
            risk = "high"
            reasons.append(f"its input went subnormal ({m:.3g} < {tiny:.3g}): one underflow from exactly 0")
        elif m < NEAR_ZERO and h.op != "sqrt":
            risk = "high"
            reasons.append(f"its input came within {m:.3g} of 0 (< {NEAR_ZERO:g})")
        else:
            reasons.append(f"smallest input {m:.3g}")
    elif h.kind == "edge" and h.guarded:
        reasons.append(f"largest |input| 1 - {m:.3g}, guarded: it was clamped inside ±1")
    elif h.kind == "edge":
        if m < NEAR_ZERO:
            risk = "high"
            reasons.append(f"its input came within {m:.3g} of ±1, the edge of its domain (< {NEAR_ZERO:g})")
        else:
            reasons.append(f"largest |input| 1 - {m:.3g}")
    elif h.kind == "masked":
        reasons.append(f"fewest unmasked positions in a row of the batches seen: {m:.0f}")
    elif h.kind == "recurrence":
        calls = f"a chain of ~{m:.0f} calls overflows {h.dtype}'s backward at that rate"
        if m <= RECURRENCE_EDGE:
            risk = "high"
            calls += f" (≤ {RECURRENCE_EDGE}: a sequence length in common use)"
        reasons.append(f"{h.pattern}: {calls}" if h.pattern else calls)
    elif h.kind == "overflow":
        risk, said = _overflow(h.dtype, m)
        reasons.append(said)
    else:
        if m < HEADROOM_EDGE:
            risk = "high"
            reasons.append(f"a result within {m:.3g}× of {h.dtype}'s largest value")
        elif m < HEADROOM_WATCH:
            risk = "medium"
            reasons.append(f"a result within {m:.3g}× of {h.dtype}'s largest value "
                           f"(under {HEADROOM_WATCH:g}×: a few doublings overflow)")
        else:
            reasons.append(f"{m:.3g}× below {h.dtype}'s largest value")
    shrink = h.shrink
    if shrink is not None and shrink >= SHRINK and h.kind not in ("overflow", "recurrence"):
        reasons.append(f"the margin shrank ×{shrink:.3g} over {len(h.margins)} steps")
    elif shrink is not None and h.kind == "overflow" and shrink >= 1.25:
        reasons.append(f"the e-folds left fell ×{shrink:.3g} over {len(h.margins)} steps")
    ahead = h.projected
    checked = max(len(h.margins), 1)
    # a trend ranks a log or a divisor, not an exp or a sqrt: their margins did not tell bugs
    # from ordinary code on real programs (their patterns did); it is still reported
    trend_ranks = h.kind in ("zero", "edge") and h.op != "sqrt" and not h.guarded
    if ahead is not None and ahead <= PROJECT * checked:
        edge = {"overflow": f"{EXP_EDGE:g} e-folds of overflow", "edge": f"{NEAR_ZERO:g} of ±1"}.get(
            h.kind, f"{NEAR_ZERO:g} of 0")
        reasons.append(f"at the rate it shrank, it comes within {edge} in ~{ahead} more steps")
        if risk == "low" and trend_ranks:
            risk = "medium"
    if h.pattern and h.kind != "recurrence":  # a recurrence's growth is its margin's reason
        p_edge = h.pattern_edge
        if p_edge is None or m <= p_edge:
            reasons.append(f"pattern: {h.pattern}")
            if risk == "low":
                risk = "medium"
        else:
            reasons.append(f"pattern: {h.pattern} — the smallest value {m:.3g} is still wide")
    h.risk, h.reasons = risk, reasons
    return h


def hazard_lines(hazards: list[Hazard], steps: int, script: str | None = None) -> list[str]:
    """The text ``nanguard check`` prints: one block per hazard, risky ones first."""
    risky = [h for h in hazards if h.risk in RISKY]
    where = f" of {script}" if script else ""
    lines = [f"nanguard check: {len(hazards)} unsafe op{'s' if len(hazards) != 1 else ''} on the path "
             f"to the loss in the first {steps} step{'s' if steps != 1 else ''}{where}; "
             f"{len(risky)} risky"]
    for h in hazards:
        mod = f"  in {h.module}" if h.module else ""
        lines.append("")
        lines.append(f"  {h.risk:<6}  {h.op:<8} {h.source or '?'}{mod}")
        if h.source_code:
            lines.append(f"          {h.source_code}")
        for r in h.reasons:
            lines.append(f"          - {r}")
        if h.stable_form and h.risk in RISKY:
            lines.append(f"          use: {h.stable_form}")
    if not hazards:
        lines.append("  no log, sqrt, division, exp or low-precision result on the path to the loss")
    return lines


def warns_early(h: Hazard) -> bool:
    """Is an assessed hazard an early warning (``latent-hazard``) of the watch? Risky by its
    margin (``high``), or by a pattern whose singular point is in its domain whatever the
    margin (``log(1 + exp(x))``'s ``+ 1`` guards the ``log``, not the ``exp``); not a pattern
    that is risky only near an edge (a division by a count at 1), not low-precision headroom
    (the watch's loss and gradient rules see it)."""
    if h.kind == "headroom" or h.risk not in RISKY:
        return False
    if h.risk == "high":
        return True
    return bool(h.pattern) and h.pattern_edge is None


def _fired(h: Hazard) -> bool:
    """Did the op already reach its singularity (a ``log`` of exactly 0, an ``exp`` past
    overflow)? Then it made the value: that is a finding, not a warning of one to come."""
    return (h.kind == "zero" and h.margin == 0 and not h.guarded) or (
        h.kind == "overflow" and h.margin <= 0)


def early_warning(h: Hazard, step: int, steps: int) -> EarlyWarning | None:
    """The watch's warning for an assessed hazard seen over ``steps`` sampled steps up to
    ``step`` (``None`` if it does not warn: :func:`warns_early`)."""
    if not warns_early(h) or _fired(h):
        return None
    where = f" at {h.source}" if h.source else ""
    mod = f" (in {h.module})" if h.module else ""
    why = h.pattern if h.pattern and h.risk != "high" else (h.reasons[0] if h.reasons else "risky")
    use = f"; use {h.stable_form}" if h.stable_form else ""
    evidence = ([h.source_code] if h.source_code else []) + [
        f"{r} (over {steps} sampled step{'s' if steps != 1 else ''})" for r in h.reasons]
    return EarlyWarning(step, "latent-hazard", f"`{h.op}`{where}{mod} can make a NaN it has not "
                        f"made yet: {why}{use}", evidence)


def _line(xs: list[float], ys: list[float]) -> tuple[float, float, float] | None:
    """Least squares ``y = a + b·x``: ``(b, a, R²)`` (``None``: the xs do not spread)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= 0 or syy <= 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return b, my - b * mx, (b * b * sxx) / syy


def _crossing(h: Hazard, steps: list[int]) -> tuple[float, str, float] | None:
    """Where the margins at these sampled steps reach their edge, on the line that fits them
    best — straight (a variance walked down by constant gradient steps, e-folds of an ``exp``
    used up) or geometric (a probability saturating, a float16 result growing ×k a step):
    ``(step, model, R²)``; ``None`` unless they fall at every sample and a line fits them."""
    ms = [h.margins[s] for s in steps]
    if any(not math.isfinite(m) for m in ms) or any(b >= a for a, b in itertools.pairwise(ms)):
        return None
    models: list[tuple[str, list[float], float]] = []
    if h.kind in ("zero", "edge", "overflow"):
        models.append(("straight", ms, 0.0))
    if h.kind in ("zero", "edge") and ms[-1] > 0:
        models.append(("geometric", [math.log(m) for m in ms], math.log(NEAR_ZERO)))
    if h.kind == "headroom" and ms[-1] > 0:
        models.append(("geometric", [math.log(m) for m in ms], 0.0))
    best: tuple[float, str, float] | None = None
    xs = [float(x) for x in steps]
    for name, ys, edge in models:
        fit = _line(xs, ys)
        if fit is None or fit[0] >= 0 or fit[2] < TREND_FIT:
            continue
        b, a, r2 = fit
        if best is None or r2 > best[2]:
            best = ((edge - a) / b, name, r2)
    return best


def trend_warning(h: Hazard, step: int, horizon: int = TREND_HORIZON) -> EarlyWarning | None:
    """The watch's warning for a margin that the run's sampled steps show falling toward its
    edge on a line that holds (kind ``margin-shrinking``), at ``step``; ``None`` when its fit
    does not hold (too few samples, not falling at each, a poor fit, a projection receding as a
    saturating curve's does), when it projects further than ``horizon`` steps ahead, or for
    an op already at its singularity or guarded by a floor."""
    if h.guarded or h.kind not in ("zero", "edge", "overflow", "headroom") or _fired(h):
        return None
    steps = sorted(h.margins)
    if len(steps) < TREND_SAMPLES + 1:
        return None
    now, before = _crossing(h, steps[-TREND_SAMPLES:]), _crossing(h, steps[-TREND_SAMPLES - 1:-1])
    if now is None or before is None:
        return None
    at = now[0]
    ahead = at - step
    if not 0 < ahead <= horizon or at - before[0] > TREND_DRIFT * ahead:
        return None
    first, last = steps[-TREND_SAMPLES], steps[-1]
    edge = {"overflow": "overflow", "headroom": f"{h.dtype}'s largest value",
            "edge": "±1, the edge of its domain"}.get(h.kind, "0")
    what = {"overflow": "e-folds left before overflow", "headroom": f"room below {h.dtype}'s largest value",
            "edge": "distance to ±1"}.get(h.kind, "smallest input")
    where = f" at {h.source}" if h.source else ""
    mod = f" (in {h.module})" if h.module else ""
    msg = (f"`{h.op}`{where}{mod}: its {what} fell {h.margins[first]:.3g} → {h.margins[last]:.3g} "
           f"over steps {first}–{last}, on a {now[1]} line (R² {now[2]:.2f}); at this rate it reaches {edge} at step ~{math.ceil(at)}")
    evidence = ([h.source_code] if h.source_code else []) + [
        f"{what} at sampled steps " + ", ".join(f"{s}: {h.margins[s]:.3g}" for s in steps[-TREND_SAMPLES - 1:])]
    if h.stable_form:
        evidence.append(f"use {h.stable_form}")
    return EarlyWarning(step, "margin-shrinking", msg, evidence, math.ceil(at))
