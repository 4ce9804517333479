"""Phrasebooks: how each framework spells a fix, so a rule writes one fix for both.

A rule never writes ``torch.`` or ``keras.`` itself: it takes the phrase from the case's
:class:`Phrasebook` (``case.say``), :data:`TORCH` or :data:`KERAS`. The fixes are grouped by what
they fix (``say.data``, ``say.masks``, ``say.lr``, ``say.init``, ``say.precision``,
``say.singular``). A phrase with ``{name}`` fields is a template
(``say.lr.new_lr.format(opt="Adam", lr="1e-3", **case.names)``: the lr phrases name the script's
optimizer ``{optvar}`` and its parameters ``{params}``); the others are used as they are. A ``None``
phrase means the framework has no such fix (the rule leaves it out).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

__all__ = [
    "KERAS",
    "TORCH",
    "DataPhrases",
    "InitPhrases",
    "LrPhrases",
    "MaskPhrases",
    "Phrasebook",
    "PrecisionPhrases",
    "SingularPhrases",
    "phrasebook",
]


@dataclass(frozen=True)
class DataPhrases:
    """Fixes for bad data and bad weights."""

    drop_bad_samples: str
    check_weights: str
    load_checkpoint: str


@dataclass(frozen=True)
class MaskPhrases:
    """Fixes for masks and non-finite literals."""

    mask_with_finite_min: str
    constant_with_finite_min: str


@dataclass(frozen=True)
class LrPhrases:
    """The learning rate, clipping, schedules (templates: opt, lr, was, clip, sched, peak, top)."""

    new_lr: str
    clip_by_value: str
    eps_fix: str
    lr_fixes: tuple[str, ...]
    lr_fixes_cyclic: tuple[str, ...] | None
    lr_fixes_scheduled: tuple[str, ...] | None
    lr_fixes_varying: tuple[str, ...] | None
    explode_fixes: tuple[str, ...]
    recurrent_fix: str | None
    scale_targets: str
    #: standardise the inputs, feature by feature, with the training set's statistics
    scale_inputs: str = ""
    #: a weight decay too strong for the learning rate (templates: opt, lr, wd, was, kept)
    weight_decay_fix: str | None = None
    #: a learning rate of the script's own update (no optimizer; templates: factor, why)
    hand_update_fix: str | None = None
    #: a learning rate the script took from its command line (templates: new, old, how: the flag
    #: as the user typed it, with the new value and the old)
    lr_flag_fix: str = "run it again with `{new}` (it was `{old}`): your learning rate comes from the command line{how}"
    #: a weight decay the script took from its command line (templates: new, old)
    wd_flag_fix: str = ("run it again with `{new}` (it was `{old}`): your weight decay comes from the "
                        "command line, and is too strong for this learning rate")


@dataclass(frozen=True)
class InitPhrases:
    """Fixes for the initialization."""

    init_fix: str
    add_normalization: str
    smaller_gain: str | None


@dataclass(frozen=True)
class PrecisionPhrases:
    """Fixes for low precision (templates: module, module_type, module_expr — the module as
    Python, ``[0].attn``; call, op and where for an op outside any module)."""

    wider_dtype_for_float16: str
    wider_dtype: str
    module_in_float32: str
    cast_to_float32: str
    loss_scaler: str


@dataclass(frozen=True)
class SingularPhrases:
    """Fixes for an op at its singular point."""

    log_softmax: str
    log_softmax_plain: str
    bce_with_logits: str
    log_sigmoid_fn: str
    log_clamp: str
    log_clamp_plain: str
    log1p_clamp: str
    normalize_with_eps: str
    div_clamp: str
    sqrt_clamp: str
    rsqrt_eps: str
    pow_clamp: str
    #: template: fn (``acos``)
    trig_clamp: str
    exp_fixes: tuple[str, ...]
    var_single: str
    xlogy_clamp: str
    sqrt_backward_fixes: tuple[str, ...]
    std_eps: str
    norm_divisor_fixes: tuple[str, ...]


@dataclass(frozen=True)
class Phrasebook:
    """The framework-specific words of the diagnosis: op names, calls, and fixes as code."""

    framework: str
    #: name ops as the framework does (``MatMul``), not by their canonical name (``mm``)
    raw_op_names: bool
    #: the optimizer's update as a call, ``{opt}``: ``Adam.step()``
    opt_call: str
    #: the optimizer's epsilon argument
    eps_name: str
    #: the clipping that reports a total norm
    clip_norm_fn: str

    # --- the fixes, by what they fix ------------------------------------------------------------
    data: DataPhrases
    masks: MaskPhrases
    lr: LrPhrases
    init: InitPhrases
    precision: PrecisionPhrases
    singular: SingularPhrases

    def op_label(self, op: str | None, canonical: str) -> str:
        """The op as the user reads it: the framework's own name, or the canonical one."""
        if self.raw_op_names and op:
            return op
        return canonical or op or "?"

    def phrases(self) -> list[str]:
        """Every phrase of the book, its groups' in order (for checks that no other framework's
        spelling is in it)."""
        return _phrases(self)


def _phrases(book: Any) -> list[str]:
    out: list[str] = []
    for f in fields(book):
        v = getattr(book, f.name)
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, tuple):
            out.extend(v)
        elif v is not None and not isinstance(v, bool):
            out.extend(_phrases(v))
    return out


_TORCH_CLIP = (
    "torch.nn.utils.clip_grad_norm_({params}, max_norm={clip})  # before {optvar}.step()"
)

#: PyTorch: ``torch``, ``nn``, ``F`` (``torch.nn.functional``)
TORCH = Phrasebook(
    framework="torch",
    raw_op_names=False,
    opt_call="{opt}.step()",
    eps_name="eps",
    clip_norm_fn="clip_grad_norm_",
    data=DataPhrases(
        drop_bad_samples=(
            "mask = torch.isfinite(x).flatten(1).all(dim=1)\nx, y = x[mask], y[mask]  # drop bad samples"
        ),
        check_weights=(
            "bad = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]\n"
            "assert not bad, f'non-finite weights: {bad}'  # right after loading"
        ),
        load_checkpoint=(
            "model.load_state_dict(torch.load('last_good.pt', weights_only=True))  # an earlier checkpoint"
        ),
    ),
    masks=MaskPhrases(
        mask_with_finite_min=(
            "scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)  # instead of float('-inf')"
        ),
        constant_with_finite_min=(
            "scores.masked_fill(mask, torch.finfo(scores.dtype).min)  # instead of float('-inf')"
        ),
    ),
    lr=LrPhrases(
        new_lr="{optvar} = torch.optim.{opt}({params}, lr={lr}{kept})",
        clip_by_value=(
            "torch.nn.utils.clip_grad_value_({params}, clip_value=1.0)"
            "  # element-wise first: no norm to overflow"
        ),
        eps_fix="{optvar} = torch.optim.{opt}({params}, lr={lr}, eps=1e-8{kept})",
        lr_fixes=(
            "{optvar} = torch.optim.{opt}({params}, lr={lr}{kept}){was}",
            _TORCH_CLIP,
            "scheduler = torch.optim.lr_scheduler.LinearLR({optvar}, start_factor=0.1, total_iters=500)  # warmup",
        ),
        lr_fixes_cyclic=(
            "lower the peak of your `{sched}`: max_lr={peak} (it reached {top}), its other arguments as they are",
            _TORCH_CLIP,
        ),
        lr_fixes_scheduled=(
            "{optvar} = torch.optim.{opt}({params}, lr={lr}{kept})  # `{sched}` scales this base "
            "learning rate; it reached {top}",
            _TORCH_CLIP,
        ),
        lr_fixes_varying=(
            "peak_lr = {peak}  # your schedule reached {top}: scale its peak down\n"
            "for g in {optvar}.param_groups:\n    g['lr'] = min(g['lr'], peak_lr)  # each step, after your schedule",
            _TORCH_CLIP,
        ),
        explode_fixes=(
            "torch.nn.utils.clip_grad_norm_({params}, max_norm={clip})  # after backward(), before step()",
            "{optvar} = torch.optim.{opt}({params}, lr={lr}{kept})",
        ),
        recurrent_fix="use nn.LSTM/nn.GRU instead of a plain nn.RNN, and truncate backpropagation through time",
        scale_targets=(
            "y = (y - y.mean()) / y.std()  # scale the targets (and x the same way); undo it on predictions"
        ),
        scale_inputs=(
            "mean, std = x.mean(0), x.std(0).clamp_min(1e-8)  # the training set's, kept for later data\n"
            "x = (x - mean) / std  # each feature to mean 0, std 1, before batching"
        ),
        weight_decay_fix=("{optvar} = torch.optim.{opt}({params}, lr={lr}, weight_decay={wd}{kept})"
                          "  # was weight_decay={was}"),
        hand_update_fix=("lr = lr * {factor}  # the learning rate of your own update (`p -= lr * p.grad`), "
                         "{why}"),
    ),
    init=InitPhrases(
        init_fix=(
            "def init(m):\n"
            "    if isinstance(m, (nn.Linear, nn.Conv2d)):\n"
            "        nn.init.kaiming_normal_(m.weight, nonlinearity='relu'); nn.init.zeros_(m.bias)\n"
            "model.apply(init)"
        ),
        add_normalization="add normalization (nn.LayerNorm / nn.BatchNorm1d) between the layers",
        smaller_gain=(
            "a smaller initial gain (e.g. nn.init.orthogonal_(w, gain=1.0)), or "
            "normalization / residual connections in a deep stack"
        ),
    ),
    precision=PrecisionPhrases(
        wider_dtype_for_float16=(
            "with torch.autocast(x.device.type, dtype=torch.bfloat16):  # bf16 has float32's range"
        ),
        wider_dtype="model.float()  # keep this part in float32",
        module_in_float32="model{module_expr}.float()  # run `{module}` in float32",
        cast_to_float32="{call}  # `{op}`{where} in float32, x: its input",
        loss_scaler="scaler = torch.amp.GradScaler()  # for float16 gradients",
    ),
    singular=SingularPhrases(
        log_softmax="logp = F.log_softmax(logits, dim=-1)  # instead of torch.log(F.softmax(...))",
        log_softmax_plain="logp = F.log_softmax(logits, dim=-1)",
        bce_with_logits="loss_fn = torch.nn.BCEWithLogitsLoss()  # pass logits: no log(sigmoid(...))",
        log_sigmoid_fn="F.logsigmoid",
        log_clamp="torch.log(x.clamp_min(1e-12))  # keep the argument of log positive",
        log_clamp_plain="torch.log(x.clamp_min(1e-12))",
        log1p_clamp="torch.log1p(x.clamp_min(-1 + 1e-6))",
        normalize_with_eps="x = (x - mean) / (std + 1e-5)  # or use nn.LayerNorm / nn.BatchNorm",
        div_clamp="x / y.clamp_min(1e-12)  # or x / (y + eps) for y >= 0",
        sqrt_clamp="torch.sqrt(x.clamp_min(0) + 1e-12)",
        rsqrt_eps="torch.rsqrt(x + 1e-5)  # the eps of a normalization layer",
        pow_clamp="x.clamp_min(1e-12).pow(p)",
        trig_clamp="torch.{fn}(x.clamp(-1 + 1e-7, 1 - 1e-7))",
        exp_fixes=(
            "torch.logsumexp(x, dim=...)  # instead of torch.log(torch.exp(x).sum(...))",
            "F.softplus(x)  # instead of torch.log(1 + torch.exp(x))",
            "torch.exp(x.clamp(max=80.0))",
        ),
        var_single="x.var(dim, unbiased=False)  # or use a batch of more than one sample",
        xlogy_clamp="torch.xlogy(x, y.clamp_min(1e-12))",
        sqrt_backward_fixes=(
            "torch.sqrt(x + 1e-12)  # keep the argument away from 0",
            "torch.sqrt((v ** 2).sum(-1) + 1e-12)  # a norm that is safe at 0",
        ),
        std_eps="x.std(dim) + 1e-5  # or (x.var(dim) + 1e-5).sqrt()",
        norm_divisor_fixes=(
            "with torch.no_grad():  # prune a channel through its magnitude g, not its direction v\n"
            "    g[i] = 0  # g: module.parametrizations.weight.original0 (old API: module.weight_g)",
            "torch.nn.utils.parametrize.remove_parametrizations(module, 'weight')"
            "  # bake the weight first, then zero the channel (old API: remove_weight_norm(module))",
        ),
    ),
)

#: Keras 3: ``keras``, ``keras.ops``; ``tf`` only where Keras has no op of its own
KERAS = Phrasebook(
    framework="keras",
    raw_op_names=True,
    opt_call="{opt}.apply()",
    eps_name="epsilon",
    clip_norm_fn="global_clipnorm clipping",
    data=DataPhrases(
        drop_bad_samples="mask = np.isfinite(x).reshape(len(x), -1).all(axis=1); x, y = x[mask], y[mask]",
        check_weights=(
            "bad = [w.path for w in model.weights if not np.isfinite(w.numpy()).all()]\n"
            "assert not bad, f'non-finite weights: {bad}'  # right after loading"
        ),
        load_checkpoint="model.load_weights('last_good.weights.h5')  # an earlier checkpoint",
    ),
    masks=MaskPhrases(
        mask_with_finite_min="scores = keras.ops.where(mask, scores, -1e9)  # instead of -inf",
        constant_with_finite_min=(
            "keras.ops.where(mask, scores, -1e9)  # a large finite negative instead of float('-inf')"
        ),
    ),
    lr=LrPhrases(
        new_lr="{optvar} = keras.optimizers.{opt}(learning_rate={lr}{kept})",
        clip_by_value=(
            "{optvar} = keras.optimizers.{opt}(learning_rate=..., clipvalue=1.0)"
            "  # element-wise first: no norm to overflow"
        ),
        eps_fix="{optvar} = keras.optimizers.{opt}(learning_rate={lr}, epsilon=1e-7{kept})",
        lr_fixes=(
            "{optvar} = keras.optimizers.{opt}(learning_rate={lr}{kept}){was}",
            "{optvar} = keras.optimizers.{opt}(learning_rate={lr}, global_clipnorm={clip}{kept})",
        ),
        lr_fixes_cyclic=None,
        lr_fixes_scheduled=None,
        lr_fixes_varying=None,
        explode_fixes=("{optvar} = keras.optimizers.{opt}(learning_rate=..., global_clipnorm={clip})",),
        recurrent_fix=None,
        scale_targets=(
            "y = (y - y.mean()) / y.std()  # scale the targets (or keras.layers.Normalization for the inputs)"
        ),
        scale_inputs=(
            "norm = keras.layers.Normalization()\n"
            "norm.adapt(x)  # the training set's mean and std, feature by feature\n"
            "x = norm(x)  # each feature to mean 0, std 1 (and norm(x_new) for later data)"
        ),
        weight_decay_fix=("{optvar} = keras.optimizers.{opt}(learning_rate={lr}, weight_decay={wd}{kept})"
                          "  # was weight_decay={was}"),
    ),
    init=InitPhrases(
        init_fix="keras.layers.Dense(units, kernel_initializer='he_normal')",
        add_normalization=(
            "add normalization (keras.layers.LayerNormalization / BatchNormalization) between the layers"
        ),
        smaller_gain=None,
    ),
    precision=PrecisionPhrases(
        wider_dtype_for_float16=(
            'keras.mixed_precision.set_global_policy("mixed_bfloat16")  # bfloat16 has float32\'s range'
        ),
        wider_dtype='keras.mixed_precision.set_global_policy("mixed_bfloat16")  # bfloat16 has float32\'s range',
        module_in_float32="keras.layers.{module_type}(..., dtype='float32')  # run `{module}` in float32",
        cast_to_float32="keras.ops.cast(x, 'float32')  # `{op}`{where} in float32, x: its input",
        loss_scaler="optimizer = keras.optimizers.LossScaleOptimizer(optimizer)  # for float16 gradients",
    ),
    singular=SingularPhrases(
        log_softmax="logp = keras.ops.log_softmax(logits, axis=-1)  # instead of log(softmax(...))",
        log_softmax_plain="logp = keras.ops.log_softmax(logits, axis=-1)",
        bce_with_logits="loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)",
        log_sigmoid_fn="keras.ops.log_sigmoid",
        log_clamp="keras.ops.log(keras.ops.maximum(x, 1e-12))",
        log_clamp_plain="keras.ops.log(keras.ops.maximum(x, 1e-12))",
        log1p_clamp="keras.ops.log1p(keras.ops.maximum(x, -1 + 1e-6))",
        normalize_with_eps=(
            "x = (x - mean) / (std + 1e-5)  # or keras.layers.LayerNormalization / BatchNormalization"
        ),
        div_clamp="x / keras.ops.maximum(y, 1e-12)",
        sqrt_clamp="keras.ops.sqrt(keras.ops.maximum(x, 0) + 1e-12)",
        rsqrt_eps="keras.ops.rsqrt(x + 1e-5)  # the epsilon of a normalization layer",
        pow_clamp="keras.ops.power(keras.ops.maximum(x, 1e-12), p)",
        trig_clamp="tf.math.{fn}(tf.clip_by_value(x, -1 + 1e-7, 1 - 1e-7))",
        exp_fixes=(
            "keras.ops.logsumexp(x, axis=...)  # instead of log(sum(exp(x)))",
            "keras.ops.softplus(x)  # instead of log(1 + exp(x))",
            "keras.ops.exp(keras.ops.minimum(x, 80.0))",
        ),
        var_single="keras.ops.var(x, axis=...)  # divides by n; or use a batch of more than one sample",
        xlogy_clamp="tf.math.xlogy(x, tf.maximum(y, 1e-12))",
        sqrt_backward_fixes=(
            "keras.ops.sqrt(x + 1e-12)  # keep the argument away from 0",
            "keras.ops.sqrt(keras.ops.sum(keras.ops.square(v), axis=-1) + 1e-12)  # a norm safe at 0",
        ),
        std_eps="keras.ops.std(x, axis=...) + 1e-5",
        norm_divisor_fixes=(
            "v / (keras.ops.norm(v, axis=..., keepdims=True) + 1e-12)  # a norm that is safe at 0",
        ),
    ),
)


def phrasebook(framework: str | None) -> Phrasebook:
    """The book of ``framework`` (``"keras"``, else PyTorch's)."""
    return KERAS if framework == "keras" else TORCH
