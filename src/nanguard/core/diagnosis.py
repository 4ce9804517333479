"""Diagnosis: choose one cause from the taxonomy, with evidence and fixes written as code.

Runs once, after a finding: it reads the finding (what op made the value, from what inputs) and
the run's history (loss, gradient norm, weight norm and learning rate of the healthy steps). The
rules are ordered from the most specific evidence (the batch itself was bad) to the most
circumstantial (a trend in the history); the first rule that matches wins. Framework-free: the
adapters describe the run in a :class:`RunContext`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .finding import Finding, TensorStats
from .history import History
from .ops import canonical_op, forward_op_of_grad_fn
from .taxonomy import Cause

__all__ = ["Diagnosis", "RunContext", "diagnose"]

_LOW_PRECISION = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}
_LOG_MAX = {"float16": 11.09, "bfloat16": 88.72, "float32": 88.72, "float64": 709.78}


@dataclass
class RunContext:
    """What the adapter knows about the run, beyond the finding.

    ``optimizer`` is the class name (``"Adam"``); ``hyper`` its first param group's
    hyper-parameters (``{"lr": 10.0, "eps": 0.0}``); ``clip_norm`` a ``max_norm`` the user already
    clips at; ``framework`` picks the spelling of the suggested code (``"torch"`` or ``"keras"``).
    """

    framework: str = "torch"
    optimizer: str | None = None
    hyper: dict[str, Any] = field(default_factory=dict)
    clip_norm: float | None = None
    num_params: int | None = None
    scheduler: str | None = None  # the class name of an LR scheduler on that optimizer

    @property
    def lr(self) -> float | None:
        lr = self.hyper.get("lr", self.hyper.get("learning_rate"))
        return float(lr) if isinstance(lr, (int, float)) else None


@dataclass
class Diagnosis:
    """One cause, how sure we are, why we think so, and what to change.

    ``evidence`` are short sentences with numbers from the run; ``fixes`` are code the user can
    paste, most likely first.
    """

    cause: Cause
    confidence: float
    summary: str
    evidence: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause.value,
            "confidence": round(self.confidence, 2),
            "summary": self.summary,
            "evidence": list(self.evidence),
            "fixes": list(self.fixes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Diagnosis:
        return cls(
            cause=Cause(d["cause"]),
            confidence=float(d.get("confidence", 0.0)),
            summary=d.get("summary", ""),
            evidence=list(d.get("evidence", [])),
            fixes=list(d.get("fixes", [])),
        )


# ----------------------------------------------------------------------------------------------
# small helpers


def _g(x: float | None) -> str:
    """Format a number the way the messages print it: 3 significant digits."""
    if x is None:
        return "?"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.3g}"


def _above_max(f32: float, dtype: str) -> str:
    """'in float32 … up to 65535, above the float16 maximum 65504' — with as many digits as it
    takes to tell the two apart."""
    top = _LOW_PRECISION[dtype]
    digits = 3
    while digits < 9 and f"{f32:.{digits}g}" == f"{top:.{digits}g}":
        digits += 1
    return (f"in float32 the same op gives values up to {f32:.{digits}g}, above the {dtype} maximum "
            f"{top:.{digits}g}")


def _shown(f: Finding, op: str | None) -> str:
    """The op as the finding's framework names it: ``addmm`` for torch, ``MatMul`` for TensorFlow."""
    if f.framework == "keras" and f.op:
        return f.op
    return op or f.op or "?"


def _nice_lr(lr: float) -> str:
    """A round learning rate a person would type: 2.5, 0.001, 3e-05."""
    if lr <= 0 or not math.isfinite(lr):
        return "1e-3"
    exp = math.floor(math.log10(lr))
    mant = lr / 10**exp
    for m in (1, 2, 2.5, 5, 10):
        if mant <= m * 1.0001:
            mant = m
            break
    val = mant * 10**exp
    return f"{val:g}"


def _denominator(f: Finding) -> TensorStats | None:
    return f.inputs[1] if len(f.inputs) > 1 else None


def _first(f: Finding) -> TensorStats | None:
    return f.inputs[0] if f.inputs else None


def _where(f: Finding) -> str:
    loc = f"`{f.module}`" if f.module else ("the model's own forward" if f.module == "" else "")
    src = f" ({f.source})" if f.source else ""
    if loc:
        return f"in {loc}{src}"
    return f"at {f.source}" if f.source else "in your code"


def _forward_op(f: Finding) -> str:
    """The forward op a person recognises: for a backward finding, the op of its grad_fn."""
    if f.phase == "backward":
        fwd = forward_op_of_grad_fn(f.grad_fn)
        if fwd:
            return canonical_op(fwd)
    return canonical_op(f.op)


def _producers(f: Finding) -> list[str]:
    return [canonical_op(p) for p in f.details.get("input_producers", []) if p]


# ----------------------------------------------------------------------------------------------
# singularities


def _singularity(f: Finding) -> tuple[str, str, list[str]] | None:
    """If the op met its singularity, return (what happened, why, fixes)."""
    op = canonical_op(f.op)
    fwd = _forward_op(f)
    x = _first(f)
    d = _denominator(f)
    prod = _producers(f)
    where = _where(f)
    torch = f.framework != "keras"

    dmax = {"float16": 65504.0, "bfloat16": 3.39e38, "float64": 1.8e308}.get(f.dtype or "", 3.4e38)

    def zeros(s: TensorStats | None, num: TensorStats | None = None) -> bool:
        """Zeros — or values so close to 0 that dividing by them overflows the dtype."""
        if s is None:
            return False
        if s.zeros > 0:
            return True
        tiny = s.smallest_abs_nonzero
        big = (num.absmax if num is not None and num.absmax else 1.0)
        return tiny is not None and tiny > 0 and big / tiny > dmax

    def neg(s: TensorStats | None) -> bool:
        return s is not None and s.negatives > 0

    def held(s: TensorStats | None, what: str) -> str:
        if s is None:
            return ""
        n = s.zeros if what == "zeros" else s.negatives
        return f"the input of `{fwd}` held {n} {what} out of {s.numel}"

    # a custom autograd.Function's backward is user code: its ops are judged as written
    if f.phase != "backward" or f.details.get("custom_function"):
        if op in ("log", "log2", "log10") and (zeros(x) or neg(x)):
            kind = "zeros" if zeros(x) else "negatives"
            fixes: list[str] = []
            if "softmax" in prod:
                fixes.append(
                    "logp = F.log_softmax(logits, dim=-1)  # instead of torch.log(F.softmax(...))"
                    if torch
                    else "logp = keras.ops.log_softmax(logits, axis=-1)  # instead of log(softmax(...))"
                )
            one_minus = bool(prod) and prod[0] in ("rsub", "sub") and "sigmoid" in prod
            if "sigmoid" in prod:
                fixes.append(
                    "loss_fn = torch.nn.BCEWithLogitsLoss()  # pass logits: no log(sigmoid(...))"
                    if torch
                    else "loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)"
                )
                fn = "F.logsigmoid" if torch else "keras.ops.log_sigmoid"
                fixes.append(
                    f"log_1m_p = {fn}(-z)  # instead of log(1 - sigmoid(z))"
                    if one_minus
                    else f"logp = {fn}(z)  # instead of log(sigmoid(z))"
                )
            fixes.append(
                "torch.log(x.clamp_min(1e-12))  # keep the argument of log positive"
                if torch
                else "keras.ops.log(keras.ops.maximum(x, 1e-12))"
            )
            why = (
                f"{held(x, kind)}: log({'0' if kind == 'zeros' else 'x<0'}) = "
                f"{'-inf' if kind == 'zeros' else 'nan'}"
            )
            if one_minus:
                why += "; its input was 1 - sigmoid(z), and sigmoid saturated to exactly 1.0"
            elif "softmax" in prod or "sigmoid" in prod:
                src = "softmax" if "softmax" in prod else "sigmoid"
                why += f"; its input came from `{src}`, which underflowed to exactly 0"
            return (f"`{fwd}` of {kind[:-1] if kind == 'zeros' else 'a negative number'} {where}", why, fixes)
        if op == "log1p" and x is not None and x.min is not None and x.min <= -1:
            return (
                f"`log1p` of a value <= -1 {where}",
                f"the input of `log1p` reached {_g(x.min)}",
                ["torch.log1p(x.clamp_min(-1 + 1e-6))" if torch else "keras.ops.log1p(keras.ops.maximum(x, -1 + 1e-6))"],
            )
        if op in ("div", "reciprocal", "fmod", "remainder", "addcdiv"):
            den = x if op == "reciprocal" else (f.inputs[2] if op == "addcdiv" and len(f.inputs) > 2 else d)
            num = None if op == "reciprocal" else (f.inputs[1] if op == "addcdiv" else x)
            if zeros(den, num) or f.scalars.get("other") == 0:
                assert den is not None or f.scalars.get("other") == 0
                n = den.zeros if den is not None else 1
                tot = den.numel if den is not None else 1
                both = num is not None and num.zeros > 0 and f.nan > 0
                kind = "0/0 = nan" if both else "x/0 = inf"
                if den is not None and not den.zeros and den.smallest_abs_nonzero:
                    kind = f"values as small as {_g(den.smallest_abs_nonzero)}: the quotient overflowed"
                    n = den.numel
                fixes = []
                if "std" in prod or "var" in prod or "sqrt" in prod:
                    fixes.append("x = (x - mean) / (std + 1e-5)  # or use nn.LayerNorm / nn.BatchNorm")
                fixes.append(
                    "x / y.clamp_min(1e-12)  # or x / (y + eps) for y >= 0"
                    if torch
                    else "x / keras.ops.maximum(y, 1e-12)"
                )
                return (
                    f"division by zero {where}",
                    f"the denominator held {n} zeros out of {tot} ({kind})",
                    fixes,
                )
        if op in ("sqrt", "pow") and neg(x):
            expo = f.scalars.get("exponent")
            if op == "sqrt" or (isinstance(expo, float) and not float(expo).is_integer()):
                return (
                    f"`{op}` of a negative number {where}",
                    f"{held(x, 'negatives')}: sqrt(x<0) = nan",
                    ["torch.sqrt(x.clamp_min(0) + 1e-12)" if torch else "keras.ops.sqrt(keras.ops.maximum(x, 0) + 1e-12)"],
                )
        if op == "rsqrt" and (zeros(x) or neg(x)):
            return (
                f"`rsqrt` of 0 or a negative number {where}",
                held(x, "zeros" if zeros(x) else "negatives"),
                ["torch.rsqrt(x + 1e-5)  # the eps of a normalization layer" if torch
                 else "keras.ops.rsqrt(x + 1e-5)  # the epsilon of a normalization layer"],
            )
        if op == "pow" and zeros(x):
            expo = f.scalars.get("exponent")
            if isinstance(expo, (int, float)) and expo < 0:
                return (
                    f"`pow` of 0 with a negative exponent {where}",
                    f"{held(x, 'zeros')}, exponent {expo}",
                    ["x.clamp_min(1e-12).pow(p)"],
                )
        if op in ("acos", "asin", "atanh") and x is not None and x.absmax is not None and x.absmax >= 1:
            return (
                f"`{op}` outside its domain [-1, 1] {where}",
                f"the input of `{op}` reached {_g(x.absmax)} in magnitude",
                [f"torch.{op}(x.clamp(-1 + 1e-7, 1 - 1e-7))" if torch
                 else f"tf.math.{op}(tf.clip_by_value(x, -1 + 1e-7, 1 - 1e-7))"],
            )
        if op in ("exp", "exp2", "expm1", "cosh", "sinh") and (f.posinf or f.nan):
            lim = _LOG_MAX.get(f.dtype or "float32", 88.72)
            if x is not None and x.max is not None and x.max > lim * 0.9:
                return (
                    f"`{op}` overflowed {where}",
                    f"the input of `{op}` reached {_g(x.max)}; exp overflows {f.dtype} above {lim:g}",
                    [
                        "torch.logsumexp(x, dim=...)  # instead of torch.log(torch.exp(x).sum(...))",
                        "F.softplus(x)  # instead of torch.log(1 + torch.exp(x))",
                        "torch.exp(x.clamp(max=80.0))",
                    ]
                    if torch
                    else [
                        "keras.ops.logsumexp(x, axis=...)  # instead of log(sum(exp(x)))",
                        "keras.ops.softplus(x)  # instead of log(1 + exp(x))",
                        "keras.ops.exp(keras.ops.minimum(x, 80.0))",
                    ],
                )
        if op in ("var", "std", "var_mean", "std_mean", "mean") and f.nan and x is not None and x.numel <= 1:
            return (
                f"`{op}` of a single element {where}",
                f"{op} with Bessel's correction divides by n-1 = 0 (the input has {x.numel} element)",
                ["x.var(dim, unbiased=False)  # or use a batch of more than one sample"],
            )
        if op == "xlogy" and (zeros(_denominator(f)) or neg(_denominator(f))):
            return (
                f"`xlogy` of a non-positive number {where}",
                "the log argument held zeros or negatives",
                ["torch.xlogy(x, y.clamp_min(1e-12))" if torch else "tf.math.xlogy(x, tf.maximum(y, 1e-12))"],
            )
        return None

    # --- backward: the forward op's derivative has the singularity -----------------------------
    if fwd in ("sqrt", "norm", "linalg_vector_norm") and (zeros(d, x) or zeros(x)):
        return (
            f"the backward of `{fwd}` divided by zero {where}",
            f"{fwd}(x) was 0 in the forward pass (finite there), and its derivative "
            f"1/(2·sqrt(x)) is infinite at 0 — `{f.grad_fn}` produced {'inf' if f.posinf or f.neginf else 'nan'}",
            [
                "torch.sqrt(x + 1e-12)  # keep the argument away from 0",
                "torch.sqrt((v ** 2).sum(-1) + 1e-12)  # a norm that is safe at 0",
            ]
            if torch
            else [
                "keras.ops.sqrt(x + 1e-12)  # keep the argument away from 0",
                "keras.ops.sqrt(keras.ops.sum(keras.ops.square(v), axis=-1) + 1e-12)  # a norm safe at 0",
            ],
        )
    if fwd == "pow" and (zeros(x) or zeros(d)):
        return (
            f"the backward of `pow` at 0 {where}",
            "the base was 0 and the exponent below 1, so the derivative p·x^(p-1) is infinite",
            ["x.clamp_min(1e-12).pow(p)"],
        )
    if fwd in ("log", "log2", "log10") and (zeros(d, x) or zeros(x)):
        tiny = d.smallest_abs_nonzero if d is not None else None
        what_held = (
            "held zeros" if d is None or d.zeros or not tiny
            else f"held values as small as {_g(tiny)}"
        )
        return (
            f"the backward of `log` at 0 {where}",
            f"the input of log {what_held}, so the derivative 1/x overflowed",
            ["torch.log(x.clamp_min(1e-12))", "logp = F.log_softmax(logits, dim=-1)"] if torch
            else ["keras.ops.log(keras.ops.maximum(x, 1e-12))", "logp = keras.ops.log_softmax(logits, axis=-1)"],
        )
    if fwd in ("div", "reciprocal") and (zeros(d, x) or zeros(x)):
        return (
            f"the backward of a division by a value near zero {where}",
            "the denominator was 0 or tiny, so the derivative -x/y² overflowed",
            ["x / (y + 1e-8)"],
        )
    if fwd in ("acos", "asin") and (f.nan or f.posinf or f.neginf):
        return (
            f"the backward of `{fwd}` at ±1 {where}",
            f"the derivative of {fwd} is infinite at ±1",
            [f"torch.{fwd}(x.clamp(-1 + 1e-7, 1 - 1e-7))" if torch
             else f"tf.math.{fwd}(tf.clip_by_value(x, -1 + 1e-7, 1 - 1e-7))"],
        )
    if fwd in ("std", "var") and (zeros(d) or zeros(x)):
        return (
            f"the backward of `{fwd}` with zero spread {where}",
            f"all values were equal, so {fwd} was 0 and its derivative divided by 0",
            ["x.std(dim) + 1e-5  # or (x.var(dim) + 1e-5).sqrt()"],
        )
    return None


# ----------------------------------------------------------------------------------------------
# the rules


def diagnose(
    finding: Finding, history: History | None = None, context: RunContext | None = None
) -> Diagnosis:
    """Choose the cause of ``finding`` and explain it.

    Called once, after the locator or the replay produced the finding (so at the failing step,
    before anything is skipped or rolled back).
    """
    f = finding
    h = history if history is not None else History()
    ctx = context if context is not None else RunContext(framework=f.framework)
    op = canonical_op(f.op)
    torch = ctx.framework != "keras"
    shown = _shown(f, op)  # the op as the user's framework names it, for the evidence
    lr = ctx.lr
    opt = ctx.optimizer or "SGD"

    # 1. the batch itself -----------------------------------------------------------------------
    if f.phase == "data":
        ev: list[str] = []
        samples = f.details.get("samples") or []
        name = f.details.get("input_name") or "the batch"
        for s in samples[:3]:
            feats = s.get("features") or []
            where = f", feature{'s' if len(feats) > 1 else ''} {', '.join(map(str, feats[:6]))}" if feats else ""
            ev.append(f"sample {s.get('index')} of {name}{where} is {s.get('kind', 'NaN')}")
        if len(samples) > 3:
            ev.append(f"… and {len(samples) - 3} more samples")
        if not ev:
            ev.append(f"{name} holds {f.what} before any operation ran")
        fixes = [
            "mask = torch.isfinite(x).flatten(1).all(dim=1)\nx, y = x[mask], y[mask]  # drop bad samples"
            if torch
            else "mask = np.isfinite(x).reshape(len(x), -1).all(axis=1); x, y = x[mask], y[mask]",
            "nanguard scan <your data file>  # find every bad row and column",
            "df = df.dropna()  # or df.fillna(...) before building tensors from a DataFrame",
        ]
        return Diagnosis(
            Cause.NONFINITE_INPUT, 0.95, f"the input batch already holds {f.what}", ev, fixes
        )

    # 2. weights already bad before the step ---------------------------------------------------
    if f.op == "parameter" or f.details.get("origin") == "parameter":
        names = f.details.get("parameters") or ([f.module] if f.module else [])
        ev = [f"`{n}` was non-finite before the step began" for n in names[:4]] or [
            "a weight was non-finite before the step began"
        ]
        if f.step in (0, None) or not h.healthy():
            ev.append("no healthy step ran before: the weights came in bad (loaded checkpoint or init)")
        fixes = [
            "bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]\n"
            "assert not bad, f'non-finite weights: {bad}'  # right after loading",
            "model.load_state_dict(torch.load('last_good.pt', weights_only=True))  # an earlier checkpoint",
        ] if torch else [
            "bad = [w.path for w in model.weights if not np.isfinite(w.numpy()).all()]\n"
            "assert not bad, f'non-finite weights: {bad}'  # right after loading",
            "model.load_weights('last_good.weights.h5')  # an earlier checkpoint",
        ]
        return Diagnosis(
            Cause.NONFINITE_PARAMETERS, 0.9, "the weights were already non-finite", ev, fixes
        )

    # 3a. an intended -inf (a mask) became NaN: softmax over a row masked entirely -------------
    masked = f.details.get("from_masked_inf")
    if masked:
        src = masked.get("source")
        by = f"`{canonical_op(masked.get('op'))}`" + (f" at {src}" if src else "")
        entire = op in ("softmax", "log_softmax")
        ev = [
            (f"`{shown}` {_where(f)} received a row that is -inf everywhere (every position masked) "
             f"and made {f.what}: softmax of only -inf is 0/0") if entire else
            (f"`{shown}` {_where(f)} turned the -inf of a mask into {f.what}"),
            f"the -inf came from {by}: on its own it is harmless; it is this {shown} that made NaN",
        ]
        x = _first(f)
        if x is not None and x.neginf:
            ev.append(f"its input held {x.neginf} -inf out of {x.numel}")
        fixes = [
            "scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)  # instead of float('-inf')"
            if torch else "scores = keras.ops.where(mask, scores, -1e9)  # instead of -inf",
            "make sure every query keeps at least one key (a padding row: mask it out of the loss, "
            "not out of the attention)",
        ]
        return Diagnosis(
            Cause.UNSAFE_OP, 0.85,
            "a row masked entirely: softmax over only -inf" if entire else "a -inf mask became NaN",
            ev, fixes,
        )

    # 3. the code wrote an explicit NaN/Inf (a -inf mask that reached the loss, a poisoned value) ---
    const = f.details.get("constant")
    if const is not None:
        ev = [f"`{shown}` {_where(f)} wrote the literal {const} and it reached the {f.reached or 'loss'}"]
        fixes = [
            "scores.masked_fill(mask, torch.finfo(scores.dtype).min)  # instead of float('-inf')"
            if torch
            else "keras.ops.where(mask, scores, -1e9)  # a large finite negative instead of float('-inf')",
            "make sure no row is masked entirely: softmax over only -inf is 0/0 = nan",
        ]
        if const == "nan":
            fixes = ["remove the assignment of nan, or write a finite value"]
        return Diagnosis(Cause.UNSAFE_OP, 0.8, f"an explicit {const} in your code reached the training", ev, fixes)

    # 4. clip_grad_norm_ swallowed an overflow: the gradients' norm itself overflowed -----------
    if "clip_grad_norm_" in str(f.details.get("sink", "")):
        ev = [
            f"`{shown}` {_where(f)} overflowed: the total gradient norm is {f.what}",
            "clip_grad_norm_ then scaled every gradient by 0: the update was silently zero "
            "and its returned norm was the only trace",
        ]
        gg = h.growth("grad_norm", 8)
        if gg and gg[2] >= 2:
            ev.append(f"grad norm over the last steps: {_g(gg[0])} → {_g(gg[1])} ({_g(gg[2])}x)")
        big = max((s.absmax or 0.0 for s in f.inputs), default=0.0)
        if big:
            ev.append(f"single gradient entries reached {_g(big)}")
        lr = ctx.lr
        fixes = [
            "torch.nn.utils.clip_grad_value_(model.parameters(), clip_value=1.0)"
            "  # element-wise first: no norm to overflow",
            "check what scales the loss this much (a loss summed instead of averaged, a loss scale, "
            "an unnormalised target)",
        ]
        if lr:
            fixes.append(
                f"optimizer = torch.optim.{ctx.optimizer or 'SGD'}(model.parameters(), lr={_nice_lr(lr / 4)})"
            )
        return Diagnosis(
            Cause.EXPLODING_GRADIENTS, 0.85, "the gradient norm overflowed inside clip_grad_norm_",
            ev, fixes,
        )

    # 5. the optimizer step -----------------------------------------------------------------------
    if f.phase == "optimizer":
        # gradients finite but so large that the optimizer's squares overflow (Adam's exp_avg_sq)
        big_in = max((s.absmax or 0.0 for s in f.inputs), default=0.0)
        gnorm = f.details.get("grad_norm")
        sq_limit = math.sqrt(_LOW_PRECISION.get(f.dtype or "", 3.4e38))
        if f.details.get("grads_finite", True) and (
            (op in ("addcmul", "mul", "pow", "square") and big_in > sq_limit)
            or (isinstance(gnorm, (int, float)) and gnorm > sq_limit)
        ):
            ev = [
                f"the gradients were finite but reached {_g(big_in or gnorm)}: their squares overflow "
                f"{f.dtype or 'float32'} in `{opt}.step()` ({f.what})",
            ]
            state = f.details.get("optimizer_state") or []
            if state:
                ev.append("non-finite optimizer state: " + ", ".join(f"`{n}`" for n in state[:3]))
            gg = h.growth("grad_norm", 32)
            if gg and gg[2] > 10:
                ev.append(f"grad norm grew {_g(gg[2])}x: {_g(gg[0])} → {_g(gg[1])}")
            return Diagnosis(
                Cause.EXPLODING_GRADIENTS, 0.85,
                "the gradients exploded until the optimizer's second moment overflowed",
                ev, _explode_fixes(ctx, h, f),
            )
        ev = []
        gn = h.series("grad_norm", 1)
        if f.details.get("grads_finite", True):
            ev.append(
                "all gradients were finite" + (f" (norm {_g(gn[-1])})" if gn else "")
                + f", yet `{opt}.{'step' if torch else 'apply'}()` made {f.what}"
            )
        eps = ctx.hyper.get("eps", ctx.hyper.get("epsilon"))
        params = f.details.get("parameters") or []
        if params:
            ev.append("first non-finite after the step: " + ", ".join(f"`{p}`" for p in params[:4]))
        sing = _singularity(f)
        zero_eps = isinstance(eps, (int, float)) and eps <= 1e-30
        if zero_eps or (sing is not None and op in ("div", "addcdiv", "sqrt", "rsqrt")):
            if zero_eps:
                ev.append(f"{opt} eps={eps}: where a gradient's second moment is 0 the update is 0/0")
            elif sing:
                ev.append(sing[1])
            fix = (
                f"optimizer = torch.optim.{opt}(model.parameters(), lr={_g(lr) if lr else '...'}, eps=1e-8)"
                if torch
                else f"optimizer = keras.optimizers.{opt}(learning_rate={_g(lr) if lr else '...'}, epsilon=1e-7)"
            )
            return Diagnosis(
                Cause.OPTIMIZER_STATE,
                0.9 if zero_eps else 0.75,
                f"`{opt}.{'step' if torch else 'apply'}()` turned finite gradients into non-finite weights",
                ev,
                [fix],
            )
        if lr is not None:
            ev.append(f"learning rate {_g(lr)}")
        ratio = [r.update_ratio for r in h.last(8) if r.update_ratio is not None]
        if ratio:
            ev.append(f"update/weight ratio of the last steps: {_g(max(ratio))} (healthy ≈ 1e-3)")
        return Diagnosis(
            Cause.LEARNING_RATE_TOO_HIGH if (f.posinf or f.neginf) else Cause.OPTIMIZER_STATE,
            0.6,
            f"`{opt}.{'step' if torch else 'apply'}()` turned finite gradients into non-finite weights",
            ev,
            _lr_fixes(ctx, h),
        )

    # 6. low precision -----------------------------------------------------------------------------
    dtype = f.dtype or ""
    if dtype in _LOW_PRECISION and (f.posinf or f.neginf or f.nan):
        f32 = f.details.get("float32_absmax")
        f32_finite = f.details.get("float32_finite")
        if f32_finite or (f32 is not None and f32 > _LOW_PRECISION[dtype]):
            ev = [
                f"`{shown}` {_where(f)} produced {f.what}",
                _above_max(f32, dtype) if f32 is not None else "in float32 the same op stays finite",
            ]
            fixes = [
                "with torch.autocast(x.device.type, dtype=torch.bfloat16):  # bf16 has float32's range"
                if dtype == "float16"
                else "model.float()  # keep this part in float32",
                f"model.{f.module}.float()  # run this module in float32" if f.module else "x.float()",
                "scaler = torch.amp.GradScaler()  # for float16 gradients",
            ]
            if not torch:
                fixes = [
                    'keras.mixed_precision.set_global_policy("mixed_bfloat16")  # bfloat16 has float32\'s range',
                    f"keras.layers.{f.module_type or 'Dense'}(..., dtype='float32')  # run `{f.module}` in float32"
                    if f.module else "keras.ops.cast(x, 'float32')",
                    "optimizer = keras.optimizers.LossScaleOptimizer(optimizer)  # for float16 gradients",
                ]
            return Diagnosis(
                Cause.LOW_PRECISION_OVERFLOW, 0.9, f"{dtype} overflow in `{shown}`", ev, fixes
            )

    # 7. an op met its singularity --------------------------------------------------------------
    sing = _singularity(f)
    if sing is not None:
        what, why, fixes = sing
        ev = [why]
        if f.phase == "backward" and f.grad_fn:
            ev.append(f"the forward pass was finite; the value was made in the backward ({f.grad_fn})")
        trend = _trend_evidence(h)
        if trend:
            ev.append("also: " + trend)
        return Diagnosis(Cause.UNSAFE_OP, 0.9, what, ev, fixes)

    # 8. an overflow of ordinary arithmetic: which of init / LR / gradients ----------------------
    return _overflow(f, h, ctx, op)


def _trend_evidence(h: History) -> str | None:
    g = h.growth("param_norm", 8)
    if g and g[2] >= 4:
        return f"the weight norm grew {_g(g[2])}x over the last steps ({_g(g[0])} → {_g(g[1])})"
    return None


def _clip_threshold(h: History) -> float:
    """A clipping threshold from the healthy history: the 90th percentile of the grad norm."""
    vals = h.series("grad_norm", 200)
    lo = min((v for v in vals if v > 0), default=None)
    if lo is None:
        return 1.0
    # the norms of the steps before any blow-up: within 10x of the smallest
    calm = sorted(v for v in vals if v <= 10 * lo)
    q = calm[min(len(calm) - 1, round(0.9 * (len(calm) - 1)))]
    # round to one significant digit so the code reads naturally
    exp = math.floor(math.log10(q))
    return float(f"{round(q / 10**exp) * 10**exp:.3g}") or 1.0


def _lr_fixes(ctx: RunContext, h: History) -> list[str]:
    opt = ctx.optimizer or "SGD"
    lr = ctx.lr
    new_lr = _nice_lr(lr / 4) if lr else "1e-3"
    clip = _clip_threshold(h)
    if ctx.framework == "keras":
        return [
            f"optimizer = keras.optimizers.{opt}(learning_rate={new_lr})"
            + (f"  # was {_g(lr)}" if lr else ""),
            f"optimizer = keras.optimizers.{opt}(learning_rate={new_lr}, global_clipnorm={clip:g})",
        ]
    lrs = h.series("lr", 500)
    clip_fix = f"torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm={clip:g})  # before optimizer.step()"
    if ctx.scheduler in ("OneCycleLR", "CyclicLR"):
        top = max([*lrs, lr or 0.0])
        return [
            f"scheduler = torch.optim.lr_scheduler.{ctx.scheduler}(optimizer, max_lr={_nice_lr(top / 4)}, ...)"
            f"  # it reached {_g(top)}",
            clip_fix,
        ]
    if ctx.scheduler is not None:
        top = max([*lrs, lr or 0.0])
        return [
            f"optimizer = torch.optim.{opt}(model.parameters(), lr={new_lr})  # `{ctx.scheduler}` "
            f"scales this base learning rate; it reached {_g(top)}",
            clip_fix,
        ]
    if lrs and min(lrs) > 0 and max(lrs) / min(lrs) > 1.05:
        # the learning rate changed from step to step: a schedule (perhaps written by hand,
        # assigning param_group["lr"]) would overwrite a new optimizer's lr — cap its peak
        top = max([*lrs, lr or 0.0])
        return [
            f"peak_lr = {_nice_lr(top / 4)}  # your schedule reached {_g(top)}: scale its peak down\n"
            "for g in optimizer.param_groups:\n    g['lr'] = min(g['lr'], peak_lr)  # each step, after your schedule",
            clip_fix,
        ]
    return [
        f"optimizer = torch.optim.{opt}(model.parameters(), lr={new_lr})"
        + (f"  # was {_g(lr)}" if lr else ""),
        f"torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm={clip:g})  # before optimizer.step()",
        "scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=500)  # warmup",
    ]


def _overflow(f: Finding, h: History, ctx: RunContext, op: str) -> Diagnosis:
    torch = ctx.framework != "keras"
    if f.op is None:
        ev = [f"{f.what} appeared {_where(f)}; the op that made it was not found "
              f"(`nanguard run --trace` names it)"]
    else:
        ev = [f"`{_shown(f, op)}` {_where(f)} produced {f.what} from finite inputs"]
    x = max(f.inputs, key=lambda s: s.absmax or 0.0, default=None)
    if x is not None and x.absmax is not None:
        ev.append(f"its largest input magnitude was {_g(x.absmax)} ({x.name})")
    scale = f.details.get("activation_scale") or []
    first_step = f.details.get("first_step", False) or (f.step == 0) or not h.healthy()

    pg = h.growth("param_norm", 8)
    pstep = h.per_step_growth("param_norm", 8)
    gg = h.growth("grad_norm", 8)
    loss_g = h.growth("loss", 8)
    ratios = [r.update_ratio for r in h.healthy() if r.update_ratio is not None]
    med_ratio = sorted(ratios)[len(ratios) // 2] if ratios else None
    lr = ctx.lr

    if first_step:
        if scale:
            s = " → ".join(f"{_g(v)}" for _, v in scale[:6])
            ev.append(f"activation scale (max |x|) layer by layer at the first step: {s}")
        top = max((v for _, v in scale), default=None)
        calm = top is not None and math.isfinite(top) and top < 1e3
        if f.phase == "backward":
            # the forward pass was finite: the gradients grew through the layers until they
            # overflowed (the initial weights' gain, compounded by depth or time steps)
            if calm:
                ev.append(f"the activations stayed small (at most {_g(top)})")
            ev.append("the forward pass was finite: the gradients overflowed in the first backward pass, "
                      "before any update")
            fixes = _explode_fixes(ctx, h, f)
            if torch:
                fixes.append("a smaller initial gain (e.g. nn.init.orthogonal_(w, gain=1.0)), or "
                             "normalization / residual connections in a deep stack")
            if f.op is None:
                fixes.append("nanguard run --trace script.py  # names the op that made it")
            return Diagnosis(
                Cause.EXPLODING_GRADIENTS, 0.7 if f.op is not None else 0.4,
                "the gradients overflowed in the first backward pass", ev, fixes,
            )
        if calm:
            # small activations everywhere: the initial weights do not explain an overflow
            ev.append(f"the activations stayed small (at most {_g(top)}): the initial weights do not "
                      "explain the overflow")
            return Diagnosis(
                Cause.BAD_INITIALIZATION, 0.4,
                "an overflow at the first step that the activations do not explain", ev,
                ["nanguard run --trace script.py  # names the op that made it"],
            )
        ev.append("no update had been applied yet: the initial weights alone overflow")
        fixes = [
            "def init(m):\n"
            "    if isinstance(m, (nn.Linear, nn.Conv2d)):\n"
            "        nn.init.kaiming_normal_(m.weight, nonlinearity='relu'); nn.init.zeros_(m.bias)\n"
            "model.apply(init)"
            if torch
            else "keras.layers.Dense(units, kernel_initializer='he_normal')",
            "add normalization (nn.LayerNorm / nn.BatchNorm1d) between the layers"
            if torch
            else "add normalization (keras.layers.LayerNormalization / BatchNormalization) between the layers",
        ]
        return Diagnosis(
            Cause.BAD_INITIALIZATION, 0.85, "the initial weights make activations overflow", ev, fixes
        )

    weights_grew = pg is not None and (pg[2] >= 4 or (pstep is not None and pstep >= 1.5))
    grads_grew = gg is not None and gg[2] >= 10
    big_updates = med_ratio is not None and med_ratio >= 0.05

    if f.phase == "backward" and not weights_grew:
        if gg:
            ev.append(f"grad norm over the last steps: {_g(gg[0])} → {_g(gg[1])} ({_g(gg[2])}x)")
        ev.append("the forward pass was finite: the gradients overflowed in the backward pass")
        return Diagnosis(
            Cause.EXPLODING_GRADIENTS, 0.8, "the gradients overflowed in the backward pass", ev,
            _explode_fixes(ctx, h, f),
        )

    if weights_grew or big_updates:
        if pg:
            per = f", ×{_g(pstep)} per step" if pstep else ""
            ev.append(f"the weight norm grew {_g(pg[2])}x over the last {min(8, len(h.healthy()))} steps: {_g(pg[0])} → {_g(pg[1])}{per}")
        if med_ratio is not None:
            ev.append(f"update/weight ratio ≈ {_g(med_ratio)} per step (healthy training: ≈ 1e-3)")
        if loss_g and loss_g[2] > 2:
            ev.append(f"the loss rose {_g(loss_g[2])}x: {_g(loss_g[0])} → {_g(loss_g[1])}")
        if lr is not None:
            ev.append(f"learning rate {_g(lr)}" + (f" ({ctx.optimizer})" if ctx.optimizer else ""))
        if ctx.clip_norm is not None:
            ev.append(f"gradients were clipped at {_g(ctx.clip_norm)}, so the growth is in the weights, not the gradient norm")
        conf = 0.85 if (weights_grew and (big_updates or (loss_g and loss_g[2] > 2))) else 0.7
        fixes = _lr_fixes(ctx, h)
        hint = _scale_hint(h, torch)
        if hint is not None:
            ev.append(hint[0])
            fixes.insert(0, hint[1])
        return Diagnosis(
            Cause.LEARNING_RATE_TOO_HIGH, conf, "updates too large for the weights: they blew up", ev, fixes,
        )

    if grads_grew:
        assert gg is not None
        ev.append(f"grad norm grew {_g(gg[2])}x over the last steps: {_g(gg[0])} → {_g(gg[1])}")
        return Diagnosis(
            Cause.EXPLODING_GRADIENTS, 0.75, "the gradient norm grew until the values overflowed", ev,
            _explode_fixes(ctx, h, f),
        )

    ev.append("no clear trend in the history: the overflow came suddenly")
    return Diagnosis(
        Cause.LEARNING_RATE_TOO_HIGH if f.phase != "backward" else Cause.EXPLODING_GRADIENTS,
        0.4,
        "an ordinary operation overflowed",
        ev,
        _lr_fixes(ctx, h),
    )


#: a loss this large at the first step means the targets (or inputs) were never scaled
_LARGE_FIRST_LOSS = 1e6


def _scale_hint(h: History, torch: bool) -> tuple[str, str] | None:
    """(evidence, fix) when the run's loss was already huge at its first step: no learning rate
    trains well on targets in the hundreds of thousands; scaling them is the fix that works."""
    first = next((r for r in h if r.loss is not None and math.isfinite(r.loss)), None)
    if first is None or first.step > 1 or abs(first.loss or 0.0) < _LARGE_FIRST_LOSS:
        return None
    return (
        f"the loss was already {_g(first.loss)} at step {first.step}: the targets (or the inputs) are "
        "on a large scale, which makes every update large",
        ("y = (y - y.mean()) / y.std()  # scale the targets (and x the same way); undo it on predictions"
         if torch else
         "y = (y - y.mean()) / y.std()  # scale the targets (or keras.layers.Normalization for the inputs)"),
    )


def _explode_fixes(ctx: RunContext, h: History, f: Finding) -> list[str]:
    clip = _clip_threshold(h)
    if ctx.framework == "keras":
        return [
            f"optimizer = keras.optimizers.{ctx.optimizer or 'SGD'}(learning_rate=..., global_clipnorm={clip:g})",
        ]
    lr = ctx.lr
    fixes = [
        f"torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm={clip:g})  # after backward(), before step()",
        f"optimizer = torch.optim.{ctx.optimizer or 'SGD'}(model.parameters(), lr={_nice_lr(lr / 4) if lr else '1e-3'})",
    ]
    if _recurrent(f):
        fixes.append("use nn.LSTM/nn.GRU instead of a plain nn.RNN, and truncate backpropagation through time")
    return fixes


def _recurrent(f: Finding) -> bool:
    """Does the finding come from a recurrent layer (by its module, type or autograd node)?"""
    text = " ".join(str(x) for x in (f.module, f.module_type, f.grad_fn, f.op) if x).lower()
    return any(k in text for k in ("rnn", "lstm", "gru", "recurren", "cell"))
