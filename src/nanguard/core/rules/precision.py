"""Rule for a float16/bfloat16 value that exceeded its dtype's range where float32 would not."""

from __future__ import annotations

from ..case import Case, Diagnosis
from ..taxonomy import Cause
from ._fmt import above_max, module_expr, op_call

__all__ = ["low_precision_overflow"]


def low_precision_overflow(case: Case) -> Diagnosis | None:
    """A float16/bfloat16 op made NaN/Inf, and the same op in float32 stays finite (or reaches
    more than the low-precision dtype holds)."""
    ev, say = case.ev, case.say
    top = ev.dtype_max
    if top is None or not ev.nonfinite or not ev.exceeds_dtype_in_float32:
        return None
    dtype = ev.dtype or ""
    f32 = ev.headroom.float32_absmax
    lines = [
        f"`{case.shown}` {ev.where} produced {ev.what}",
        above_max(f32, dtype, top) if f32 is not None and f32 > top
        else "in float32 the same op stays finite",
    ]
    name = op_call(ev.op)
    fixes = [
        say.precision.wider_dtype_for_float16 if dtype == "float16" else say.precision.wider_dtype,
        say.precision.module_in_float32.format(module=ev.module, module_type=ev.module_type or "Dense",
                                               module_expr=module_expr(ev.module))
        if ev.module else
        say.precision.cast_to_float32.format(call=f"torch.{name}(x.float())" if name else "x.float()",
                                             op=name or case.shown,
                                             where=f" at {ev.source}" if ev.source else ""),
    ]
    if ev.phase == "backward" and not case.ctx.loss_scaler:
        # a loss scale moves gradients, not forward values: no help for a forward overflow
        fixes.append(say.precision.loss_scaler)
    return Diagnosis(Cause.LOW_PRECISION_OVERFLOW, 0.9, f"{dtype} overflow in `{case.shown}`", lines, fixes)
