"""An op met its singularity: log of 0, a division by 0, sqrt of a negative number, exp overflow,
or — in the backward pass — the infinite derivative of sqrt, log, pow or a division at 0.

Each check names the ops it judges with :func:`nanguard.core.ops.register_singularity`, beside its
code: plain for ops judged by their own inputs (forward and optimizer ops, and ops in a custom
``autograd.Function``'s backward), ``backward=True`` for an autograd node, judged by the forward
op it differentiates. :func:`find_singularity` looks the op up by its canonical name with
:func:`nanguard.core.ops.singularity_check`, so the catalogue has no order; the op table's
``singular`` / ``backward_singular`` traits say in words what the checks look for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..case import Case, Diagnosis
from ..evidence import Evidence
from ..finding import TensorStats
from ..ops import DTYPE_MAX, LOG_MAX, norm_divisor, register_singularity, singularity_check
from ..taxonomy import Cause
from ._fmt import num

__all__ = [
    "Singularity",
    "find_singularity",
    "nonfinite_from_small_inputs",
    "op_at_singularity",
]

@dataclass(frozen=True)
class Singularity:
    """What happened (the summary), why (one evidence sentence), and the fixes."""

    what: str
    why: str
    fixes: list[str]


Check = Callable[[Case], "Singularity | None"]


def _zeros(ev: Evidence, s: TensorStats | None, num_: TensorStats | None = None) -> bool:
    """Zeros — or values so close to 0 that dividing by them overflows the dtype (float32 when
    it is not known)."""
    if s is None:
        return False
    if s.zeros > 0:
        return True
    tiny = s.smallest_abs_nonzero
    big = num_.absmax if num_ is not None and num_.absmax else 1.0
    top = DTYPE_MAX.get(ev.dtype or "", DTYPE_MAX["float32"])
    return tiny is not None and tiny > 0 and big / tiny > top


def _neg(s: TensorStats | None) -> bool:
    return s is not None and s.negatives > 0


def _held(ev: Evidence, s: TensorStats | None, what: str) -> str:
    if s is None:
        return ""
    if what == "zeros" and not s.zeros and s.smallest_abs_nonzero:
        return (f"the input of `{ev.forward_op}` held no exact zero but values as small as "
                f"{num(s.smallest_abs_nonzero)} (of {s.numel})")
    n = s.zeros if what == "zeros" else s.negatives
    return f"the input of `{ev.forward_op}` held {n} {what} out of {s.numel}"


# --- ops judged by their own inputs --------------------------------------------------------------


@register_singularity("log", "log2", "log10")
def _log(case: Case) -> Singularity | None:
    ev, say = case.ev, case.say
    x = ev.input(0)
    if not (_zeros(ev, x) or _neg(x)):
        return None
    kind = "zeros" if _zeros(ev, x) else "negatives"
    prod = ev.producers
    fixes: list[str] = []
    if "softmax" in prod:
        fixes.append(say.singular.log_softmax)
    one_minus = bool(prod) and prod[0] in ("rsub", "sub") and "sigmoid" in prod
    if "sigmoid" in prod:
        fixes.append(say.singular.bce_with_logits)
        fn = say.singular.log_sigmoid_fn
        fixes.append(f"log_1m_p = {fn}(-z)  # instead of log(1 - sigmoid(z))" if one_minus
                     else f"logp = {fn}(z)  # instead of log(sigmoid(z))")
    fixes.append(say.singular.log_clamp)
    why = (f"{_held(ev, x, kind)}: log({'0' if kind == 'zeros' else 'x<0'}) = "
           f"{'-inf' if kind == 'zeros' else 'nan'}")
    if one_minus:
        why += "; its input was 1 - sigmoid(z), and sigmoid saturated to exactly 1.0"
    elif "softmax" in prod or "sigmoid" in prod:
        src = "softmax" if "softmax" in prod else "sigmoid"
        why += f"; its input came from `{src}`, which underflowed to exactly 0"
    what = "zero" if kind == "zeros" else "a negative number"
    return Singularity(f"`{ev.forward_op}` of {what} {ev.where}", why, fixes)


@register_singularity("log1p")
def _log1p(case: Case) -> Singularity | None:
    ev = case.ev
    x = ev.input(0)
    if x is None or x.min is None or x.min > -1:
        return None
    return Singularity(f"`log1p` of a value <= -1 {ev.where}",
                       f"the input of `log1p` reached {num(x.min)}", [case.say.singular.log1p_clamp])


@register_singularity("div", "reciprocal", "fmod", "remainder", "addcdiv")
def _div(case: Case) -> Singularity | None:
    ev, op = case.ev, case.ev.op_name
    x = ev.input(0)
    den = x if op == "reciprocal" else (
        ev.input(2) if op == "addcdiv" and len(ev.inputs) > 2 else ev.input(1)
    )
    numer = None if op == "reciprocal" else (ev.input(1) if op == "addcdiv" else x)
    tensor_zero = _zeros(ev, den, numer)
    if not (tensor_zero or ev.divides_by_scalar_zero):
        return None
    both = numer is not None and numer.zeros > 0 and ev.nan > 0
    kind = "0/0 = nan" if both else "x/0 = inf"
    if den is None or not tensor_zero:
        why = f"the divisor was the number 0 ({kind})"
    else:
        why = f"the denominator held {den.zeros} zeros out of {den.numel} ({kind})"
    if den is not None and tensor_zero and not den.zeros and den.smallest_abs_nonzero:
        why = (f"the denominator held no exact zero but values as small as "
               f"{num(den.smallest_abs_nonzero)}: the quotient overflowed, as x/0 does")
    fixes = []
    if {"std", "var", "sqrt"} & set(ev.producers):
        fixes.append(case.say.singular.normalize_with_eps)
    fixes.append(case.say.singular.div_clamp)
    return Singularity(f"division by zero {ev.where}", why, fixes)


@register_singularity("sqrt")
def _sqrt(case: Case) -> Singularity | None:
    ev = case.ev
    x = ev.input(0)
    if not _neg(x):
        return None
    return Singularity(f"`{ev.op_name}` of a negative number {ev.where}",
                       f"{_held(ev, x, 'negatives')}: sqrt(x<0) = nan", [case.say.singular.sqrt_clamp])


@register_singularity("pow")
def _pow(case: Case) -> Singularity | None:
    ev = case.ev
    x = ev.input(0)
    expo = ev.exponent
    if _neg(x) and isinstance(expo, float) and not float(expo).is_integer():
        return _sqrt(case)
    if _zeros(ev, x) and isinstance(expo, (int, float)) and expo < 0:
        return Singularity(f"`pow` of 0 with a negative exponent {ev.where}",
                           f"{_held(ev, x, 'zeros')}, exponent {expo}", [case.say.singular.pow_clamp])
    return None


@register_singularity("rsqrt")
def _rsqrt(case: Case) -> Singularity | None:
    ev = case.ev
    x = ev.input(0)
    if not (_zeros(ev, x) or _neg(x)):
        return None
    return Singularity(f"`rsqrt` of 0 or a negative number {ev.where}",
                       _held(ev, x, "zeros" if _zeros(ev, x) else "negatives"), [case.say.singular.rsqrt_eps])


@register_singularity("acos", "asin", "atanh")
def _trig(case: Case) -> Singularity | None:
    ev, op = case.ev, case.ev.op_name
    x = ev.input(0)
    if x is None or x.absmax is None or x.absmax < 1:
        return None
    return Singularity(f"`{op}` outside its domain [-1, 1] {ev.where}",
                       f"the input of `{op}` reached {num(x.absmax)} in magnitude",
                       [case.say.singular.trig_clamp.format(fn=op)])


@register_singularity("exp", "exp2", "expm1", "cosh", "sinh")
def _exp(case: Case) -> Singularity | None:
    ev, op = case.ev, case.ev.op_name
    if not (ev.posinf or ev.nan):
        return None
    lim = LOG_MAX.get(ev.dtype or "float32", LOG_MAX["float32"])
    x = ev.input(0)
    if x is None or x.max is None or x.max <= lim * 0.9:
        return None
    return Singularity(f"`{op}` overflowed {ev.where}",
                       f"the input of `{op}` reached {num(x.max)}; exp overflows {ev.dtype} above {lim:.2f}",
                       list(case.say.singular.exp_fixes))


@register_singularity("var", "std", "var_mean", "std_mean", "mean")
def _var_single(case: Case) -> Singularity | None:
    ev, op = case.ev, case.ev.op_name
    x = ev.input(0)
    if not ev.nan or x is None or x.numel > 1:
        return None
    return Singularity(f"`{op}` of a single element {ev.where}",
                       f"{op} with Bessel's correction divides by n-1 = 0 (the input has {x.numel} element)",
                       [case.say.singular.var_single])


@register_singularity("xlogy")
def _xlogy(case: Case) -> Singularity | None:
    ev = case.ev
    y = ev.input(1)
    if not (_zeros(ev, y) or _neg(y)):
        return None
    return Singularity(f"`xlogy` of a non-positive number {ev.where}",
                       "the log argument held zeros or negatives", [case.say.singular.xlogy_clamp])


@register_singularity("_weight_norm_interface", "_weight_norm")  # which input: ops.norm_divisor
def _zero_norm(case: Case) -> Singularity | None:
    """Weight normalization divides by the norm of ``v``: a slice of zeros has norm 0 — 0/0."""
    ev = case.ev
    i = norm_divisor(ev.op)
    v = ev.input(i) if i is not None else None
    if v is None or not v.zeros or not ev.nan:
        return None
    return Singularity(
        f"`{case.shown}` divided by the norm of an all-zero `{v.name}` {ev.where}",
        f"the input `{v.name}` held {v.zeros} zeros out of {v.numel}: where a slice of `{v.name}` is "
        f"all zeros its norm — the denominator — is 0, and {v.name}/‖{v.name}‖ = 0/0 = nan ({ev.what})",
        list(case.say.singular.norm_divisor_fixes),
    )


# --- backward: the forward op's derivative has the singularity ----------------------------------


@register_singularity("sqrt", "norm", backward=True)  # norm: linalg_vector_norm
def _sqrt_backward(case: Case) -> Singularity | None:
    ev, fwd = case.ev, case.ev.forward_op
    x, d = ev.input(0), ev.input(1)
    if not (_zeros(ev, d, x) or _zeros(ev, x)):
        return None
    return Singularity(
        f"the backward of `{fwd}` divided by zero {ev.where}",
        f"{fwd}(x) was 0 in the forward pass (finite there), and its derivative "
        f"1/(2·sqrt(x)) is infinite at 0 — `{ev.grad_fn}` produced {'inf' if ev.infinite else 'nan'}",
        list(case.say.singular.sqrt_backward_fixes),
    )


@register_singularity("pow", backward=True)
def _pow_backward(case: Case) -> Singularity | None:
    ev = case.ev
    if not (_zeros(ev, ev.input(0)) or _zeros(ev, ev.input(1))):
        return None
    return Singularity(f"the backward of `pow` at 0 {ev.where}",
                       "the base was 0 and the exponent below 1, so the derivative p·x^(p-1) is infinite",
                       [case.say.singular.pow_clamp])


@register_singularity("log", "log2", "log10", backward=True)
def _log_backward(case: Case) -> Singularity | None:
    ev = case.ev
    x, d = ev.input(0), ev.input(1)
    if not (_zeros(ev, d, x) or _zeros(ev, x)):
        return None
    tiny = d.smallest_abs_nonzero if d is not None else None
    held = "held zeros" if d is None or d.zeros or not tiny else f"held values as small as {num(tiny)}"
    return Singularity(f"the backward of `log` at 0 {ev.where}",
                       f"the input of log {held}, so the derivative 1/x overflowed",
                       [case.say.singular.log_clamp_plain, case.say.singular.log_softmax_plain])


@register_singularity("div", "reciprocal", backward=True)
def _div_backward(case: Case) -> Singularity | None:
    ev = case.ev
    x, d = ev.input(0), ev.input(1)
    if not (_zeros(ev, d, x) or _zeros(ev, x)):
        return None
    return Singularity(f"the backward of a division by a value near zero {ev.where}",
                       "the denominator was 0 or tiny, so the derivative -x/y² overflowed",
                       ["x / (y + 1e-8)"])


@register_singularity("acos", "asin", backward=True)
def _trig_backward(case: Case) -> Singularity | None:
    ev, fwd = case.ev, case.ev.forward_op
    if not ev.nonfinite:
        return None
    return Singularity(f"the backward of `{fwd}` at ±1 {ev.where}",
                       f"the derivative of {fwd} is infinite at ±1",
                       [case.say.singular.trig_clamp.format(fn=fwd)])


@register_singularity("std", "var", backward=True)
def _spread_backward(case: Case) -> Singularity | None:
    ev, fwd = case.ev, case.ev.forward_op
    if not (_zeros(ev, ev.input(1)) or _zeros(ev, ev.input(0))):
        return None
    return Singularity(f"the backward of `{fwd}` with zero spread {ev.where}",
                       f"all values were equal, so {fwd} was 0 and its derivative divided by 0",
                       [case.say.singular.std_eps])


def find_singularity(case: Case) -> Singularity | None:
    """The singularity the op met, if the evidence shows one."""
    ev = case.ev
    # a custom autograd.Function's backward is user code: its ops are judged as written
    if ev.phase != "backward" or ev.provenance.custom_function:
        check: Check | None = singularity_check(ev.op_name)
    else:
        check = singularity_check(ev.forward_op, backward=True)
    return check(case) if check is not None else None


def op_at_singularity(case: Case) -> Diagnosis | None:
    """An op met its singularity (forward or, via its autograd node, backward)."""
    sing = find_singularity(case)
    if sing is None:
        return None
    ev, trend = case.ev, case.trend
    lines = [sing.why]
    if ev.phase == "backward" and ev.grad_fn:
        lines.append(f"the forward pass was finite; the value was made in the backward ({ev.grad_fn})")
    w = trend.weights
    if w is not None and w.factor >= 4:
        lines.append(f"also: the weight norm grew {num(w.factor)}x over the last steps "
                     f"({num(w.first)} → {num(w.last)})")
    return Diagnosis(Cause.UNSAFE_OP, 0.9, sing.what, lines, sing.fixes)


#: inputs below this magnitude cannot overflow float32/float64 through ordinary arithmetic
SMALL_INPUT = 1e3


def nonfinite_from_small_inputs(case: Case) -> Diagnosis | None:
    """A forward op made NaN/Inf from finite inputs that are all small: that is no overflow of
    large values but a singular point the catalogue does not name (0/0, a zero norm, a value
    outside the op's domain)."""
    ev = case.ev
    if ev.phase != "forward" or ev.op is None or not ev.inputs or ev.dtype_max is not None:
        return None
    if any(s.absmax is None or s.nonfinite for s in ev.inputs):
        return None
    x = max(ev.inputs, key=lambda s: s.absmax or 0.0)
    big = x.absmax or 0.0
    if big >= SMALL_INPUT:
        return None
    lines = [
        f"`{case.shown}` {ev.where} produced {ev.what} from finite inputs no larger than "
        f"{num(big)} ({x.name})",
        f"values this small cannot overflow {ev.dtype or 'float32'}: the op met a singular point "
        "(0/0, a zero norm or count as a denominator, a value outside its domain)",
    ]
    zeros = [s for s in ev.inputs if s.zeros]
    if zeros:
        lines.append("inputs holding zeros: " + ", ".join(
            f"`{s.name}` ({s.zeros} of {s.numel})" for s in zeros[:3]))
    return Diagnosis(
        Cause.UNSAFE_OP, 0.5, f"`{case.shown}` made {ev.what} from small finite inputs", lines,
        ["x / (y + 1e-12)  # keep a denominator (a norm, a std, a count) away from 0",
         "nanguard run --trace script.py  # the op's input statistics, at the step it failed"],
    )
