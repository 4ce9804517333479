"""Hand-written diagnosis cases, one per rule of ``RULES``, from plain numbers (no framework).

``cases(framework)`` names ops as that framework does (``aten.log.default`` / ``Log``), so the
same cases check both phrasebooks. ``contradictions(diagnosis)`` lists the evidence sentences
that deny the diagnosis's own cause.
"""

from __future__ import annotations

import math
import re
from dataclasses import fields
from typing import Any

from nanguard.core.case import Case, DataScale, Diagnosis, RunContext
from nanguard.core.evidence import Evidence, Headroom, MaskSource, Notes, Provenance, Sample, Update
from nanguard.core.finding import TensorStats
from nanguard.core.phrases import phrasebook
from nanguard.core.taxonomy import Cause
from nanguard.core.trends import Growth, Trends


def stats(name: str = "x", numel: int = 16, dtype: str = "float32", **kw: object) -> TensorStats:
    return TensorStats(name=name, dtype=dtype, shape=(numel,), numel=numel, **kw)  # type: ignore[arg-type]


#: twenty healthy steps with nothing growing
CALM = Trends(
    healthy_steps=20, weights=Growth(10.0, 10.5, 1.05), weights_per_step=1.006,
    grads=Growth(1.0, 1.1, 1.1), grads_long=Growth(1.0, 1.1, 1.1), loss=Growth(2.3, 1.5, 0.65),
    median_update_ratio=1e-3, recent_update_ratios=(1e-3, 1.2e-3), grad_norms=(1.0, 1.1, 0.9) * 5,
    lrs=(0.01,) * 20, last_grad_norm=1.1, first_loss=(0, 2.3),
)
#: no healthy step yet
FIRST = Trends()
#: weights growing ×3 per step under large updates, loss rising
GROWING = Trends(
    healthy_steps=6, weights=Growth(10.0, 2430.0, 243.0), weights_per_step=3.0,
    grads=Growth(1.0, 2.0, 2.0), loss=Growth(2.0, 90.0, 45.0), median_update_ratio=0.4,
    recent_update_ratios=(0.3, 0.5), grad_norms=(1.0, 1.5, 2.0), lrs=(10.0,) * 6,
    last_grad_norm=2.0, first_loss=(0, 2.0),
)
#: one healthy step whose update was as large as the weights (Adam at a learning rate 2,500× too high)
AFTER_HUGE_UPDATE = Trends(
    healthy_steps=1, median_update_ratio=1.03, recent_update_ratios=(1.03,), grad_norms=(141.7,),
    lrs=(2.5,), last_grad_norm=141.7, first_loss=(0, 2886.9),
)
#: raw features and targets in the hundreds: a first loss of 1.45e5, the weights blown up since
RAW_DATA = Trends(
    healthy_steps=4, weights=Growth(4.36e4, 9.75e17, 2.24e13), weights_per_step=2.8e4,
    loss=Growth(1.45e5, 8.6e20, 5.9e15), median_update_ratio=1.0, recent_update_ratios=(1.0, 1.0),
    grad_norms=(1e5, 1e9), lrs=(0.1,) * 4, last_grad_norm=1e9, first_loss=(0, 1.45e5),
)
#: the gradient norm grew 100× with the weights steady
GRADS_GREW = Trends(
    healthy_steps=20, weights=Growth(10.0, 10.2, 1.02), weights_per_step=1.003,
    grads=Growth(1.0, 100.0, 100.0), grads_long=Growth(1.0, 100.0, 100.0),
    loss=Growth(2.0, 2.5, 1.25), median_update_ratio=1e-3, grad_norms=(1.0, 1.2, 100.0),
    lrs=(0.01,) * 20, last_grad_norm=100.0, first_loss=(0, 2.0),
)


def _ctx(fw: str, **kw: object) -> RunContext:
    return RunContext(framework=fw, **kw)  # type: ignore[arg-type]


#: the group of each typed ``details`` field of :class:`Evidence` (``clip_total_norm``: ``update``)
_GROUPS = {"provenance": Provenance, "update": Update, "headroom": Headroom, "notes": Notes}
_GROUP_OF = {f.name: g for g, cls in _GROUPS.items() for f in fields(cls)}


def evidence(**flat: Any) -> Evidence:
    """:class:`Evidence` from flat field names (``phase=``, ``clip_total_norm=``, ``samples=``):
    each typed ``details`` field goes into its group."""
    own: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {g: {} for g in _GROUPS}
    for k, v in flat.items():
        if k in _GROUP_OF:
            groups[_GROUP_OF[k]][k] = v
        else:
            own[k] = v
    return Evidence(**own, **{g: _GROUPS[g](**kw) for g, kw in groups.items()})


def case(fw: str, trend: Trends = CALM, ctx: RunContext | None = None, **ev: object) -> Case:
    """A case of ``fw`` from evidence fields, flat (``phase`` is required)."""
    return Case(ev=evidence(framework=fw, **ev), trend=trend,
                ctx=ctx or _ctx(fw, optimizer="SGD", hyper={"lr": 0.01}), say=phrasebook(fw))


def cases(fw: str) -> dict[str, Case]:
    """One case per rule, named after the rule that must decide it."""
    k = fw == "keras"

    def op(torch_name: str, tf_name: str) -> str:
        return tf_name if k else torch_name

    mm, mm_bw = op("aten.addmm.default", "MatMul"), op("aten.mm.default", "MatMul")
    huge = (stats("input", absmax=1e30, min=-1e30, max=1e30), stats("weight", absmax=2.0))
    return {
        "batch_holds_nonfinite": case(
            fw, phase="data", op="input", dtype="float32", shape=(32, 4), nan=3, origin="data",
            input_name="x", samples=(Sample(3, "NaN", (1,)), Sample(7, "NaN", (0, 2)))),
        "update_made_the_symptom": case(
            fw, AFTER_HUGE_UPDATE, phase="forward", op=op("aten.exp.default", "Exp"), module="vae", posinf=8,
            dtype="float32", inputs=(stats("self", min=-1486.0, max=1477.0, absmax=1486.0),),
            ctx=_ctx(fw, optimizer="Adam", hyper={"lr": 2.5})),
        "weights_already_nonfinite": case(
            fw, FIRST, phase="forward", op="parameter", module="fc", origin="parameter",
            parameters=("fc.weight",), nan=4, step=0),
        "mask_row_became_nan": case(
            fw, phase="forward", op=op("aten._softmax.default", "Softmax"), module="attn", nan=8,
            dtype="float32", shape=(2, 8), inputs=(stats("scores", neginf=8, min=-2.0, max=3.0, absmax=3.0),),
            masked_inf=MaskSource(op("aten.masked_fill.Scalar", "SelectV2"), "m.py:9", "attn")),
        "explicit_nonfinite_constant": case(
            fw, phase="forward", op=op("aten.masked_fill.Scalar", "SelectV2"), neginf=4,
            constant="-inf", reached="loss"),
        "decay_too_strong": case(
            fw, GROWING, phase="forward", op=mm, module="fc2", posinf=3, dtype="float32",
            inputs=huge, ctx=_ctx(fw, optimizer="SGD", hyper={"lr": 0.05, "weight_decay": 60.0})),
        "clip_norm_overflowed": case(
            fw, GRADS_GREW, phase="backward", op=op("aten.linalg_vector_norm.default", "Sqrt"),
            posinf=1, clip_total_norm=math.inf, reached="total gradient norm",
            inputs=(stats("grad", absmax=3e37),)),
        "optimizer_squares_overflowed": case(
            fw, GRADS_GREW, phase="optimizer", op=op("aten.addcmul_.default", "Mul"), posinf=5,
            dtype="float32", grads_finite=True, inputs=(stats("grad", absmax=2e20),),
            optimizer_state=("fc.weight:exp_avg_sq",),
            ctx=_ctx(fw, optimizer="Adam", hyper={"lr": 1e-3})),
        "optimizer_made_nonfinite": case(
            fw, phase="optimizer", op=op("Adam.step", "Adam.apply"), nan=6, grads_finite=True,
            parameters=("emb.weight",), ctx=_ctx(fw, optimizer="Adam", hyper={"lr": 1e-3, "eps": 0.0})),
        "unscaled_data": case(
            fw, RAW_DATA, phase="forward", op=op("aten.mse_loss.default", "Square"), posinf=1, dtype="float32",
            inputs=(stats("self", absmax=1.3e19, min=8e17, max=1.3e19), stats("target", absmax=446.0, max=446.0)),
            ctx=_ctx(fw, optimizer="SGD", hyper={"lr": 0.1}, data_scale=DataScale(
                inputs_absmax=999.2, feature_spread=999.3, targets_absmax=446.0,
                regression=op("mse_loss", "mean_squared_error")))),
        "optimizer_step_too_large": case(
            fw, GROWING, phase="optimizer", op=op("SGD.step", "SGD.apply"), posinf=2,
            grads_finite=True, ctx=_ctx(fw, optimizer="SGD", hyper={"lr": 10.0})),
        "low_precision_overflow": case(
            fw, phase="forward", op=mm, module="fc1", module_type="Linear", dtype="float16",
            posinf=3, float32_finite=True, float32_absmax=7.1e4,
            inputs=(stats("input", dtype="float16", absmax=300.0),)),
        "op_at_singularity": case(
            fw, phase="forward", op=op("aten.log.default", "Log"), module="head", neginf=3,
            inputs=(stats("x", zeros=3, min=0.0, max=0.9, absmax=0.9),),
            input_producers=(op("aten._softmax.default", "Softmax"),)),
        "nonfinite_from_small_inputs": case(
            fw, FIRST, phase="forward", op=op("aten.linalg_solve.default", "MatrixSolve"), nan=4,
            inputs=(stats("A", zeros=16, min=0.0, max=0.0, absmax=0.0), stats("B", absmax=1.0))),
        "first_backward_overflow": case(
            fw, FIRST, phase="backward", op=mm_bw, grad_fn=op("MmBackward0", "_MatMulGrad"),
            posinf=4, inputs=huge, activation_scale=(("rnn", 0.9), ("head", 1.5))),
        "first_step_overflow_small_activations": case(
            fw, FIRST, phase="forward", op=mm, posinf=4, inputs=huge,
            activation_scale=(("fc1", 3.0), ("fc2", math.nan))),
        "initial_weights_overflow": case(
            fw, FIRST, phase="forward", op=mm, posinf=4, inputs=huge,
            activation_scale=(("l1", 10.0), ("l5", 1e20), ("l9", math.inf))),
        "backward_overflow": case(
            fw, phase="backward", op=mm_bw, grad_fn=op("MmBackward0", "_MatMulGrad"), posinf=2,
            inputs=huge),
        "updates_too_large": case(
            fw, GROWING, phase="forward", op=mm, posinf=2, inputs=huge,
            ctx=_ctx(fw, optimizer="SGD", hyper={"lr": 10.0})),
        "grad_norm_grew": case(fw, GRADS_GREW, phase="forward", op=mm, posinf=2, inputs=huge),
        "expansive_recurrence": case(
            fw, phase="forward", op=mm, posinf=2, inputs=huge, module="rnn.cell",
            ctx=_ctx(fw, optimizer="SGD", hyper={"lr": 0.01}, recurrences={"rnn": (1.36, 296.0)})),
        "sudden_overflow": case(fw, phase="forward", op=mm, posinf=2, inputs=huge),
    }


# --- evidence that denies its cause --------------------------------------------------------------

#: phrases that, in an evidence sentence, say the opposite of the cause
DENIES: dict[Cause, tuple[str, ...]] = {
    Cause.NONFINITE_INPUT: ("from finite inputs", "the batch was finite"),
    Cause.UNSAFE_OP: ("the initial weights alone overflow", "no singular", "came suddenly"),
    Cause.EXPLODING_GRADIENTS: ("gradients stayed small", "gradient norm stayed", "all gradients were finite"),
    Cause.LEARNING_RATE_TOO_HIGH: ("no update had been applied", "before any update"),
    Cause.BAD_INITIALIZATION: ("do not explain", "after healthy steps", "not the initial"),
    Cause.LOW_PRECISION_OVERFLOW: ("in float32 the same op overflows", "float32 also overflows"),
    Cause.OPTIMIZER_STATE: ("gradients were not finite", "no update had been applied"),
    Cause.NONFINITE_PARAMETERS: ("weights were finite",),
    Cause.UNSCALED_DATA: ("the data is standardised", "within unit scale"),
}
_ABOVE = re.compile(r"up to ([-+.\deE]+), above the \w+ maximum ([-+.\deE]+)")
_GREW = re.compile(r"\bgrew ([-+.\deE]+)x")


def contradictions(d: Diagnosis) -> list[str]:
    """The evidence sentences of ``d`` that say the opposite of its cause, or of themselves."""
    out = []
    for s in d.evidence:
        low = s.lower()
        if any(p in low for p in DENIES[d.cause]):
            out.append(s)
        elif "held 0 zeros" in low or "held 0 negative" in low:
            out.append(s)  # a singularity with no value at it
        elif (m := _ABOVE.search(s)) and float(m.group(1)) <= float(m.group(2)):
            out.append(s)  # "above the maximum" of a value below it
        elif (g := _GREW.search(s)) and float(g.group(1)) < 1:
            out.append(s)  # "grew" by shrinking
    return out


#: spellings of one framework that must never reach the other's user
TORCH_WORDS = re.compile(r"\btorch\b|\bnn\.|\bF\.|\.clamp|clip_grad|\baten\b|GradScaler|unbiased|"
                         r"param_groups|parametrize|\.float\(\)|\.step\(\)")
KERAS_WORDS = re.compile(r"\bkeras\b|\btf\.|LossScaleOptimizer|\.apply\(\)")
