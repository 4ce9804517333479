"""How the diagnosis writes numbers: 3 significant digits, round learning rates."""

from __future__ import annotations

import math

__all__ = ["above_max", "module_expr", "nice_lr", "num", "op_call"]


def num(x: float | None) -> str:
    """Format a number the way the messages print it: 3 significant digits."""
    if x is None:
        return "?"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.3g}"


def nice_lr(lr: float) -> str:
    """A round learning rate a person would type, never above ``lr``: 2.5, 0.001, 5e-05."""
    if lr <= 0 or not math.isfinite(lr):
        return "1e-3"
    exp = math.floor(math.log10(lr))
    mant = lr / 10**exp
    for m in (10, 5, 2.5, 2, 1):
        if mant >= m * 0.9999:
            mant = m
            break
    val = mant * 10**exp
    return f"{val:g}"


def above_max(f32: float, dtype: str, top: float) -> str:
    """'in float32 … up to 65535, above the float16 maximum 65504' — with as many digits as it
    takes to tell the two apart."""
    digits = 3
    while digits < 9 and f"{f32:.{digits}g}" == f"{top:.{digits}g}":
        digits += 1
    return (f"in float32 the same op gives values up to {f32:.{digits}g}, above the {dtype} maximum "
            f"{top:.{digits}g}")


def module_expr(path: str) -> str:
    """A module path as Python that reaches it from the model: ``"0"`` → ``"[0]"``,
    ``"encoder.layers.3.attn"`` → ``".encoder.layers[3].attn"`` (``model.0`` is a syntax error);
    a part that is no identifier goes through ``get_submodule``."""
    out = ""
    for part in path.split("."):
        if part.isdigit():
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}"
        else:
            return f".get_submodule({path!r})"
    return out


#: aten ops that overflow in low precision and are torch functions of the same name
_TORCH_FUNCTIONS = frozenset({
    "exp", "expm1", "pow", "mul", "add", "sub", "div", "sum", "mean", "prod", "cumsum", "cumprod",
    "matmul", "mm", "bmm", "square", "norm", "var", "std", "sinh", "cosh", "softmax", "log_softmax",
    "logsumexp", "einsum",
})


def op_call(op: str | None) -> str | None:
    """The torch function an aten op is (``"aten.exp.default"`` → ``"exp"``,
    ``"aten._softmax.default"`` → ``"softmax"``), when it is one a script calls."""
    if not op or not op.startswith("aten."):
        return None
    name = op.split(".")[1].strip("_")
    return name if name in _TORCH_FUNCTIONS else None
