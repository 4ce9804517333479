"""Framework-free knowledge about operations: canonical names and their singularities.

Adapters name ops in their own way (``aten.log.default``, ``aten.div_.Tensor``, TF's ``RealDiv``);
the diagnosis rules read one canonical lower-case name (``log``, ``div``).
"""

from __future__ import annotations

import re

__all__ = [
    "ADAPTIVE_OPTIMIZERS",
    "LINEAR_OPS",
    "SINGULAR_OPS",
    "canonical_op",
    "forward_op_of_grad_fn",
    "norm_divisor",
]

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

#: Ops whose result overflows when their inputs are merely large (the "blew up" family).
LINEAR_OPS = frozenset(
    {
        "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "conv1d", "conv2d",
        "conv3d", "cudnn_convolution", "mkldnn_convolution", "_convolution", "einsum", "add",
        "sub", "mul", "sum", "mean", "addcmul", "lstm", "rnn_tanh", "rnn_relu", "gru",
        "native_layer_norm", "native_batch_norm", "_native_batch_norm_legit",
        "_native_batch_norm_legit_functional", "cumsum", "prod", "pow", "square", "threshold_backward",
        "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention", "_efficient_attention_forward", "dot", "mv",
        "addmv", "addbmm", "linalg_vector_norm", "norm", "_foreach_norm", "var", "std",
        "embedding", "tanh_backward", "sigmoid_backward", "gelu", "gelu_backward", "silu",
        "silu_backward", "relu", "leaky_relu", "elu", "clone", "copy", "_to_copy", "cat",
        "stack", "mse_loss", "mse_loss_backward", "l1_loss", "huber_loss",
    }
)

#: Ops with a singularity in their domain (forward or backward).
SINGULAR_OPS = frozenset(
    {
        "log", "log2", "log10", "log1p", "div", "reciprocal", "sqrt", "rsqrt", "pow", "acos",
        "asin", "atanh", "acosh", "exp", "exp2", "expm1", "fmod", "remainder", "xlogy", "lgamma",
        "digamma", "polygamma", "erfinv", "tan", "var", "std", "var_mean", "std_mean", "mean",
        "linalg_vector_norm", "norm", "logit", "special_xlog1py", "cosh", "sinh",
        "_softmax", "softmax", "_log_softmax", "log_softmax", "logsumexp", "binary_cross_entropy",
        "addcdiv", "_foreach_addcdiv", "_foreach_div", "_foreach_sqrt", "_foreach_reciprocal",
    }
)

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
    aliases = {
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
    return aliases.get(name, name)


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
