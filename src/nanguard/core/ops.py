"""Framework-free knowledge about operations: one table of op traits, canonical names, dtype limits.

Adapters name ops in their own way (``aten.log.default``, ``aten.div_.Tensor``, TF's ``RealDiv``);
:func:`canonical_op` turns them into one lower-case name (``log``, ``div``) and :func:`op_traits`
says what nanguard knows about it: where it has a singular point, whether it can make a
non-finite value from finite inputs at all, whether it only moves or selects values. Both
locators (torch and Keras) and the diagnosis read this one table; custom ops join it with
:func:`register_op_traits`, as ``torch.utils.flop_counter.register_flop_formula`` adds a FLOP
formula::

    nanguard.register_op_traits("mylib::safe_log", safe=True)        # clamps: never -inf
    nanguard.register_op_traits("mylib::fast_rsqrt", singular="x <= 0")

The table is read when an op runs under a locator (every op under ``--trace``/``locate()``, a
failing step's ops in a replay); registering is cheap and takes effect for the next op.

The diagnosis' check of an op's singular point — did this ``log`` meet a zero? — joins the same
place by decorator, beside its code (:func:`register_singularity`, used by
:mod:`nanguard.core.rules.singular`); :func:`singularity_check` looks it up. The dtype limits
(:data:`DTYPE_MAX`, :data:`LOG_MAX`) are written here once, for every module that needs them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Any, TypeVar

__all__ = [
    "ADAPTIVE_OPTIMIZERS",
    "DTYPE_MAX",
    "LOG_MAX",
    "LOW_PRECISION",
    "OpTraits",
    "canonical_op",
    "dtype_max",
    "exp_overflow",
    "forward_op_of_grad_fn",
    "norm_divisor",
    "on_traits_change",
    "op_traits",
    "register_op_traits",
    "register_singularity",
    "singularity_check",
    "singularity_ops",
    "unregister_op_traits",
    "update_norm_estimate",
]


@dataclass(frozen=True)
class OpTraits:
    """What an op can do to finite values.

    Attributes:
        singular: where its value has a singular point, in words (``"x <= 0"`` for ``log``):
            finite inputs there give NaN/Inf. ``None``: no singular point in the forward pass.
        backward_singular: where only its derivative has one (``sqrt`` at 0: finite forward,
            infinite gradient).
        safe: it cannot make a non-finite value from finite inputs (views, copies, ReLU, softmax,
            dropout, pooling, ``cat``): a locator need not check its output unless an input is
            already non-finite.
        linear: built from sums and products (matmul, add, convolution, norms): it makes Inf only
            by overflow, when its inputs are large.
        explains: its output explains a singularity met by the next op (a softmax that
            underflowed to 0 before a ``log``): a locator remembers that it made a tensor.
        selects: it takes part of a tensor (indexing, ``select``, ``gather``): a batch is what
            comes out of ``data[i]``.
        moves: out of place, it only moves a value (views, ``clone``, casts): a literal that
            passes through stays a literal.
        self_explains: its first operand is what explains a singular result (the ``x`` of
            ``log(x)``, ``x / y``): an in-place variant (``log_``) overwrites the evidence, so a
            locator copies it before the op runs.
        uninitialized: it returns memory nothing has written yet (``empty``): whatever bits it
            holds are no value an op made, so a locator never checks them.
        relu: a ReLU — early TensorFlow's ``ReluGrad input is not finite`` fired at its gradient.
        reads: it copies a value into Python (``.item()``, ``float(t)``).
        softmax: a softmax (``log_softmax`` too): a row that is -inf everywhere (every position
            masked) is 0/0, so the -inf of a mask becomes NaN here.
        squares: it can square a value (``mul(g, g)``, ``addcmul(v, g, g)``, ``pow``): an input
            above the square root of the dtype's largest value overflows (Adam's second moment).
    """

    singular: str | None = None
    backward_singular: str | None = None
    safe: bool = False
    linear: bool = False
    explains: bool = False
    selects: bool = False
    moves: bool = False
    self_explains: bool = False
    uninitialized: bool = False
    relu: bool = False
    reads: bool = False
    softmax: bool = False
    squares: bool = False


_UNKNOWN = OpTraits()


def _table() -> dict[str, OpTraits]:
    t: dict[str, OpTraits] = {}

    def add(names: str, **traits: Any) -> None:
        for n in names.split():
            t[n] = replace(t.get(n, _UNKNOWN), **traits)

    # --- singular points (forward; the diagnosis says which inputs met them) ---------------------
    add("log log2 log10", singular="x <= 0 (log 0 = -inf, log of a negative = NaN)")
    add("log1p", singular="x <= -1")
    add("div fmod remainder", singular="a denominator == 0")
    add("addcdiv", singular="tensor2 == 0 (Adam with eps=0)")
    add("reciprocal", singular="x == 0")
    add("rsqrt", singular="x <= 0")
    add("sqrt", singular="x < 0", backward_singular="x == 0 (d sqrt(x)/dx = 1/(2 sqrt(x)))")
    add("pow", singular="x == 0 with a negative exponent, x < 0 with a fractional one",
        backward_singular="x == 0 with an exponent below 1")
    add("acos asin", singular="|x| > 1", backward_singular="|x| == 1")
    add("atanh", singular="|x| >= 1")
    add("acosh", singular="x < 1")
    add("logit", singular="x <= 0 or x >= 1")
    add("erfinv", singular="|x| >= 1")
    add("tan", singular="x at pi/2 + k pi")
    add("lgamma digamma polygamma", singular="x a non-positive integer")
    add("xlogy xlog1py", singular="y <= 0 (y <= -1) where x != 0")
    add("exp exp2 expm1 cosh sinh", singular="x large (overflow: exp(x) > the dtype's max)")
    add("var std var_mean std_mean", singular="fewer than 2 elements (0/0)",
        backward_singular="all elements equal (the derivative of sqrt at 0)")
    add("mean", singular="no elements (0/0)")
    add("norm", backward_singular="x == 0 (the derivative of sqrt at 0)")
    add("cdist", backward_singular="two equal points (distance 0)")
    add("atan2", backward_singular="x == y == 0")
    add("softmax log_softmax", singular="a row that is -inf everywhere (0/0)")
    add("logsumexp", singular="a row that is -inf everywhere")
    add("binary_cross_entropy", singular="an input outside [0, 1]")
    add("_weight_norm_interface _weight_norm", singular="a slice of v all zeros (v / ‖v‖ = 0/0)")

    # --- cannot make a non-finite value from finite inputs ------------------------------------
    add("view _unsafe_view reshape expand t transpose permute unsqueeze squeeze alias detach "
        "as_strided contiguous clone split split_with_sizes chunk unbind narrow cat stack "
        "index_select gather embedding select slice index _unsafe_index flip roll lift_fresh "
        "relu threshold threshold_backward hardtanh clamp clamp_min clamp_max sigmoid tanh "
        "softmax log_softmax abs neg where max min amax amin masked_fill "
        "max_pool1d max_pool2d_with_indices max_pool3d_with_indices adaptive_max_pool2d "
        "max_pool2d_with_indices_backward native_dropout native_dropout_backward "
        "zeros_like ones_like zeros ones empty empty_like empty_strided new_empty new_zeros "
        "new_ones new_empty_strided zero fill full full_like arange", safe=True)

    # --- make Inf only by overflow ------------------------------------------------------------
    add("mm addmm bmm baddbmm matmul linear convolution _convolution conv1d conv2d conv3d "
        "cudnn_convolution mkldnn_convolution einsum add sub mul sum mean addcmul cumsum prod "
        "dot mv addmv addbmm pow norm var std lstm rnn_tanh rnn_relu gru native_layer_norm "
        "native_batch_norm _native_batch_norm_legit _native_batch_norm_legit_functional "
        "scaled_dot_product_attention _scaled_dot_product_flash_attention "
        "_scaled_dot_product_efficient_attention _efficient_attention_forward "
        "threshold_backward tanh_backward sigmoid_backward gelu gelu_backward silu "
        "silu_backward leaky_relu elu mse_loss mse_loss_backward l1_loss huber_loss copy",
        linear=True)

    # --- what a locator remembers or follows ----------------------------------------------------
    add("softmax log_softmax sigmoid tanh exp sqrt std var var_mean std_mean norm mean sum",
        explains=True)
    add("select slice index index_select narrow _unsafe_index take masked_select gather",
        selects=True)
    add("lift_fresh detach alias clone copy view _unsafe_view expand unsqueeze squeeze reshape",
        moves=True)
    add("log log2 log10 log1p sqrt rsqrt reciprocal exp exp2 expm1 pow acos asin atanh div",
        self_explains=True)
    add("empty empty_like empty_strided new_empty new_empty_strided empty_permuted", uninitialized=True)
    add("relu threshold", relu=True)
    add("_local_scalar_dense", reads=True)
    add("softmax log_softmax", softmax=True)
    add("mul addcmul pow", squares=True)
    return t


_BUILTIN: Mapping[str, OpTraits] = MappingProxyType(_table())
_REGISTERED: dict[str, OpTraits] = {}
_LISTENERS: list[Callable[[], None]] = []


def _key(name: str) -> str:
    # a custom op's qualified name (``mylib::safe_log``) is kept as written; aten's
    # (``aten::log_``) and any other spelling (``aten.log.default``, TF's ``RealDiv``) is
    # canonicalised, so one entry covers an op and its in-place and ``_foreach_`` variants
    ns, sep, op = name.partition("::")
    if sep and ns != "aten":
        return name
    return canonical_op(op if sep else name)


def op_traits(name: str | None, qualified: str | None = None) -> OpTraits:
    """The traits of an op: registered ones first (by ``qualified`` name, ``"mylib::safe_log"``,
    when the adapter has one, then by ``name``), then the built-in table; an op nanguard knows
    nothing about gets the defaults (not safe, no known singular point)."""
    if _REGISTERED:
        for n in (qualified, name):
            hit = _REGISTERED.get(_key(n)) if n else None
            if hit is not None:
                return hit
    return _BUILTIN.get(canonical_op(name), _UNKNOWN) if name else _UNKNOWN


def register_op_traits(name: str, **traits: Any) -> OpTraits:
    """Tell nanguard what a custom op can do, for every locator from the next op on.

    ``name`` is the op's qualified name for a torch custom op (``"mylib::safe_log"``, as
    ``torch.library`` defines it), or any name :func:`canonical_op` understands (a TensorFlow op
    type such as ``"MyCustomOp"``). ``traits`` are the fields of :class:`OpTraits`; those not given
    keep the built-in values of an op of that name (none for a new op). Returns the traits now in
    force. Registering the same name again replaces them.
    """
    valid = {f.name for f in fields(OpTraits)}
    unknown = sorted(set(traits) - valid)
    if unknown:
        raise TypeError(f"register_op_traits: unknown trait(s) {', '.join(unknown)}; valid: {', '.join(sorted(valid))}")
    key = _key(name)
    # a custom op is only what its author says it is; a known op keeps what is not restated
    out = replace(_BUILTIN.get(key, _UNKNOWN), **traits)
    _REGISTERED[key] = out
    for fn in list(_LISTENERS):
        fn()
    return out


def unregister_op_traits(name: str) -> None:
    """Undo :func:`register_op_traits` for ``name`` (the built-in traits, if any, apply again)."""
    if _REGISTERED.pop(_key(name), None) is not None:
        for fn in list(_LISTENERS):
            fn()


def on_traits_change(fn: Callable[[], None]) -> None:
    """Call ``fn`` after each :func:`register_op_traits` (an adapter's per-op cache clears)."""
    _LISTENERS.append(fn)


# --- dtype limits -------------------------------------------------------------------------------

#: the largest finite value of each floating dtype
DTYPE_MAX: Mapping[str, float] = MappingProxyType({
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
    "float32": 3.4028234663852886e38,
    "float64": 1.7976931348623157e308,
})
#: ``log`` of the largest finite value of each floating dtype: ``exp`` of more overflows
LOG_MAX: Mapping[str, float] = MappingProxyType({k: math.log(v) for k, v in DTYPE_MAX.items()})
#: dtypes whose range a float32 computation would not overflow (low-precision evidence)
LOW_PRECISION = frozenset({"float16", "bfloat16"})


def _dtype_name(dtype: str) -> str:
    name = str(dtype).rsplit(".", 1)[-1]
    return {"half": "float16", "float": "float32", "double": "float64"}.get(name, name)


def dtype_max(dtype: str | None) -> float | None:
    """The largest finite value of ``dtype`` (``"float16"``, ``"torch.bfloat16"``, ``"half"``)."""
    return DTYPE_MAX.get(_dtype_name(dtype)) if dtype else None


def exp_overflow(dtype: str | None) -> float | None:
    """``x`` above which ``exp(x)`` overflows ``dtype`` (88.7 in float32): its :data:`LOG_MAX`."""
    return LOG_MAX.get(_dtype_name(dtype)) if dtype else None


# --- singularity checks -------------------------------------------------------------------------

_Check = TypeVar("_Check", bound=Callable[..., Any])
#: (canonical op name, judged as an autograd node?) -> the diagnosis' check of its singular point
_SINGULARITIES: dict[tuple[str, bool], Callable[..., Any]] = {}


def register_singularity(*names: str, backward: bool = False) -> Callable[[_Check], _Check]:
    """Make the decorated function the diagnosis' check of the singular point of ``names``, as
    ``torch.utils.flop_counter.register_flop_formula`` registers a FLOP formula::

        @register_singularity("log", "log2", "log10")
        def _log(case: Case) -> Singularity | None: ...

    ``backward=False``: an op judged by its own inputs (a forward or optimizer op, an op in a
    custom ``autograd.Function``'s backward); ``backward=True``: an autograd node, judged by the
    forward op it differentiates (``sqrt`` for ``SqrtBackward0``). Names are any spelling
    :func:`canonical_op` understands; registering a name again replaces its check. The built-in
    checks are in :mod:`nanguard.core.rules.singular`, registered when it is imported (importing
    :mod:`nanguard.core` does); the table's ``singular`` / ``backward_singular`` traits say in
    words what they check.
    """
    keys = [canonical_op(n) for n in names]

    def register(check: _Check) -> _Check:
        for k in keys:
            _SINGULARITIES[(k, backward)] = check
        return check

    return register


def singularity_check(name: str | None, *, backward: bool = False) -> Callable[..., Any] | None:
    """The check registered for op ``name`` (``None`` if none): with ``backward``, the one for
    the autograd node of the forward op ``name``."""
    return _SINGULARITIES.get((canonical_op(name), backward)) if name else None


def singularity_ops(*, backward: bool = False) -> frozenset[str]:
    """The canonical names of the ops with a registered check (with ``backward``: the forward ops
    whose autograd nodes have one)."""
    return frozenset(k for k, b in _SINGULARITIES if b == backward)


# --- optimizers ---------------------------------------------------------------------------------

#: optimizers whose per-element step is about ``lr`` whatever the gradient's scale
ADAPTIVE_OPTIMIZERS = frozenset(
    {"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta", "Adafactor",
     "SparseAdam", "Lion", "Adam8bit", "AdamWScheduleFree", "Nadam", "Adamw"}
)


def update_norm_estimate(
    optimizer: str | None, lr: float | None, grad_norm: float | None, num_params: int | None
) -> float | None:
    """Estimated ``|Δw|`` of one step: ``lr·|g|`` for SGD-like updates, ``lr·sqrt(n)`` for
    adaptive ones (Adam's per-element step is about ``lr``)."""
    if lr is None:
        return None
    if optimizer in ADAPTIVE_OPTIMIZERS:
        return lr * num_params**0.5 if num_params else None
    return lr * grad_norm if grad_norm is not None else None


# --- names --------------------------------------------------------------------------------------

_TF_NAMES = {
    "realdiv": "div",
    "divnonan": "div",
    "truediv": "div",
    "floordiv": "div",
    "reciprocal": "reciprocal",
    "inv": "reciprocal",
    "matmul": "mm",
    "batchmatmul": "bmm",
    "batchmatmulv2": "bmm",
    "batchmatmulv3": "bmm",
    "biasadd": "add",
    "addv2": "add",
    "conv2d": "convolution",
    "conv1d": "convolution",
    "conv3d": "convolution",
    "relugrad": "threshold_backward",
    "softmax": "softmax",
    "logsoftmax": "log_softmax",
    "sub": "sub",
    "mul": "mul",
    "log": "log",
    "log1p": "log1p",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "pow": "pow",
    "exp": "exp",
    "sum": "sum",
    "mean": "mean",
    "square": "pow",
    "xlogy": "xlogy",
}
_ALIASES = {
    "true_divide": "div",
    "divide": "div",
    "floor_divide": "div",
    "_softmax": "softmax",
    "_log_softmax": "log_softmax",
    "square": "pow",
    "special_xlog1py": "xlog1py",
    "linalg_vector_norm": "norm",
    "_to_copy": "copy",
}
_SUFFIX = re.compile(r"Backward\d*$")
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
_TF_GRAD = re.compile(r"_?([A-Z][A-Za-z0-9]*?)Grad")


def canonical_op(op: str | None) -> str:
    """``aten.log.default`` → ``log``; ``aten.div_.Tensor`` → ``div``; ``RealDiv`` → ``div``.

    Leading underscores of private aten names are kept (``_softmax``) except for a few
    well-known aliases, trailing ``_`` of in-place variants is dropped, ``_foreach_x`` → ``x``.
    """
    if not op:
        return ""
    parts = op.split(".")
    name = parts[1] if parts[0] in ("aten", "prims", "tf", "keras") and len(parts) >= 2 else parts[0]
    low = name.lower()
    if low in _TF_NAMES and name[:1].isupper():
        return _TF_NAMES[low]
    if len(parts) == 1 and name[:1].isupper():
        return _CAMEL.sub("_", name).lower()  # another TF op type: Acos -> acos, Sigmoid -> sigmoid
    if name.startswith("_foreach_"):
        name = name[len("_foreach_") :]
    name = name.rstrip("_")
    return _ALIASES.get(name, name)


def forward_op_of_grad_fn(grad_fn: str | None) -> str | None:
    """``SqrtBackward0`` → ``sqrt``; ``LinalgVectorNormBackward0`` → ``linalg_vector_norm``;
    TensorFlow's ``_SqrtGrad`` → ``Sqrt``."""
    if not grad_fn:
        return None
    tf_grad = _TF_GRAD.fullmatch(grad_fn)
    if tf_grad:  # a TensorFlow gradient function: _SqrtGrad -> Sqrt (canonical_op maps TF names)
        return tf_grad.group(1)
    base = _SUFFIX.sub("", grad_fn.split("::")[-1])
    if not base:
        return None
    return _CAMEL.sub("_", base).lower()


#: ops that divide by the norm of one of their inputs, and which input (weight normalization:
#: ``g · v / ‖v‖``, ``v`` first)
_NORM_DIVISORS = {"_weight_norm_interface": 0, "_weight_norm": 0}


def norm_divisor(op: str | None) -> int | None:
    """For an op that divides by the norm of one of its inputs, that input's index (``0`` for
    ``aten._weight_norm_interface``: a slice of ``v`` that is all zeros gives 0/0); else ``None``."""
    return _NORM_DIVISORS.get(canonical_op(op))
