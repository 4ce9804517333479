"""The diagnosis rules, one by one, with plain numbers (no torch, no TensorFlow).

Each rule of ``RULES`` has a hand-written case it must decide (``_rule_cases.cases``); the tests
below check what each rule says, that it stays out of the near misses, that the table's order
holds, and that no framework's spelling reaches the other's user.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from _rule_cases import (
    CALM,
    FIRST,
    GRADS_GREW,
    GROWING,
    KERAS_WORDS,
    TORCH_WORDS,
    case,
    cases,
    contradictions,
    stats,
)
from nanguard.core import RULES, Cause, Finding, diagnose
from nanguard.core.diagnosis import diagnose_case
from nanguard.core.evidence import Evidence
from nanguard.core.phrases import KERAS, TORCH
from nanguard.core.rules import inputs, optimizer, overflow, precision, singular
from nanguard.core.trends import Growth

NAMES = [r.__name__ for r in RULES]


def test_every_rule_has_a_case_and_the_table_has_no_duplicates() -> None:
    assert len(set(NAMES)) == len(NAMES)
    assert set(cases("torch")) == set(NAMES)
    assert NAMES[-1] == "sudden_overflow"  # the last rule always matches


@pytest.mark.parametrize("fw", ["torch", "keras"])
@pytest.mark.parametrize("name", NAMES)
def test_each_case_is_decided_by_its_rule(fw: str, name: str) -> None:
    d = diagnose_case(cases(fw)[name])
    assert d.rule == name
    assert d.summary and d.evidence and d.fixes
    assert contradictions(d) == []


@pytest.mark.parametrize("name", NAMES)
def test_no_torch_spelling_reaches_a_keras_user_and_back(name: str) -> None:
    k = diagnose_case(cases("keras")[name])
    for text in [k.summary, *k.evidence, *k.fixes]:
        assert not TORCH_WORDS.search(text), text
    t = diagnose_case(cases("torch")[name])
    for text in [t.summary, *t.evidence, *t.fixes]:
        assert not KERAS_WORDS.search(text), text


def test_the_phrasebooks_keep_to_their_framework() -> None:
    assert [p for p in KERAS.phrases() if TORCH_WORDS.search(p)] == []
    assert [p for p in TORCH.phrases() if KERAS_WORDS.search(p)] == []
    assert TORCH.op_label("aten.addmm.default", "addmm") == "addmm"
    assert KERAS.op_label("MatMul", "mm") == "MatMul"


# --- rule by rule ---------------------------------------------------------------------------------


def test_batch_holds_nonfinite() -> None:
    d = inputs.batch_holds_nonfinite(cases("torch")["batch_holds_nonfinite"])
    assert d is not None and d.cause is Cause.NONFINITE_INPUT and d.confidence == 0.95
    assert d.evidence[:2] == ["sample 3 of x, feature 1 is NaN", "sample 7 of x, features 0, 2 are NaN"]
    assert inputs.batch_holds_nonfinite(case("torch", phase="forward")) is None


def test_weights_already_nonfinite() -> None:
    d = inputs.weights_already_nonfinite(cases("torch")["weights_already_nonfinite"])
    assert d is not None and d.cause is Cause.NONFINITE_PARAMETERS
    assert d.evidence == ["`fc.weight` was non-finite before the step began",
                          "no healthy step ran before: the weights came in bad (loaded checkpoint or init)"]
    assert inputs.weights_already_nonfinite(case("torch", phase="forward", op="aten.mm.default")) is None


def test_a_masked_row_and_an_explicit_constant() -> None:
    d = inputs.mask_row_became_nan(cases("torch")["mask_row_became_nan"])
    assert d is not None and d.cause is Cause.UNSAFE_OP and "softmax of only -inf is 0/0" in d.evidence[0]
    assert "torch.finfo" in d.fixes[0]
    d = inputs.explicit_nonfinite_constant(cases("keras")["explicit_nonfinite_constant"])
    assert d is not None and d.cause is Cause.UNSAFE_OP and d.confidence == 0.8
    assert "keras.ops.where" in d.fixes[0]
    nan = inputs.explicit_nonfinite_constant(case("torch", phase="forward", constant="nan"))
    assert nan is not None and nan.fixes == ["remove the assignment of nan, or write a finite value"]


def test_clip_norm_overflowed_reads_the_typed_marker() -> None:
    c = cases("torch")["clip_norm_overflowed"]
    d = optimizer.clip_norm_overflowed(c)
    assert d is not None and d.cause is Cause.EXPLODING_GRADIENTS and d.confidence == 0.85
    assert "clip_grad_value_" in d.fixes[0]
    assert "single gradient entries reached 3e+37" in d.evidence
    # the prose of the sink is not evidence: only the returned norm is
    prose = replace(c.ev.update, clip_total_norm=None, sink="clip_grad_norm_")
    assert optimizer.clip_norm_overflowed(replace(c, ev=replace(c.ev, update=prose))) is None
    finite = replace(c.ev.update, clip_total_norm=5.0)
    assert optimizer.clip_norm_overflowed(replace(c, ev=replace(c.ev, update=finite))) is None


def test_optimizer_rules() -> None:
    c = cases("torch")
    d = optimizer.optimizer_squares_overflowed(c["optimizer_squares_overflowed"])
    assert d is not None and d.cause is Cause.EXPLODING_GRADIENTS
    assert "their squares overflow float32 in `Adam.step()`" in d.evidence[0]
    small = replace(c["optimizer_squares_overflowed"].ev, inputs=(stats("grad", absmax=1e3),))
    assert optimizer.optimizer_squares_overflowed(replace(c["optimizer_squares_overflowed"], ev=small)) is None

    # Adam whose steps swamped the weights (DQN at lr 2500): clipping stops the overflow of the
    # second moment, not the steps — the learning rate goes first, said why
    assert d.fixes[0].startswith("torch.nn.utils.clip_grad_norm_(")  # calm updates: the clip first
    swamped = replace(c["optimizer_squares_overflowed"],
                      trend=replace(GRADS_GREW, median_update_ratio=0.4, recent_update_ratios=(0.4,)))
    d = optimizer.optimizer_squares_overflowed(swamped)
    assert d is not None and d.cause is Cause.EXPLODING_GRADIENTS
    assert d.fixes[0].startswith("optimizer = torch.optim.Adam(model.parameters(), lr="), d.fixes
    assert d.fixes[0].endswith("# Adam's steps were 0.4 of the weights (healthy ≈ 1e-3): clipping the gradients "
                               "does not shrink them"), d.fixes[0]
    # the learning rate came from the command line (nanoGPT's --learning_rate=10.0): changed there
    flagged = replace(swamped, ctx=replace(swamped.ctx, argv=["--learning_rate=1e-3", "--lr_decay_iters=500"]))
    d = optimizer.optimizer_squares_overflowed(flagged)
    assert d is not None and d.fixes[0].startswith("run it again with `--learning_rate="), d.fixes
    assert "(it was `--learning_rate=1e-3`)" in d.fixes[0]

    d = optimizer.optimizer_made_nonfinite(c["optimizer_made_nonfinite"])
    assert d is not None and d.cause is Cause.OPTIMIZER_STATE and d.confidence == 0.9
    assert "Adam eps=0.0: where a gradient's second moment is 0 the update is 0/0" in d.evidence
    assert d.fixes == ["optimizer = torch.optim.Adam(model.parameters(), lr=0.001, eps=1e-8)"]
    k = optimizer.optimizer_made_nonfinite(cases("keras")["optimizer_made_nonfinite"])
    assert k is not None and k.fixes == ["optimizer = keras.optimizers.Adam(learning_rate=0.001, epsilon=1e-7)"]
    assert optimizer.optimizer_made_nonfinite(c["optimizer_step_too_large"]) is None

    d = optimizer.optimizer_step_too_large(c["optimizer_step_too_large"])
    assert d is not None and d.cause is Cause.LEARNING_RATE_TOO_HIGH and d.confidence == 0.6
    nan = replace(c["optimizer_step_too_large"], ev=replace(c["optimizer_step_too_large"].ev, posinf=0, nan=3))
    assert diagnose_case(nan).cause is Cause.OPTIMIZER_STATE


def test_low_precision_overflow() -> None:
    c = cases("torch")["low_precision_overflow"]
    d = precision.low_precision_overflow(c)
    assert d is not None and d.cause is Cause.LOW_PRECISION_OVERFLOW
    assert d.evidence[1] == "in float32 the same op gives values up to 7.1e+04, above the float16 maximum 6.55e+04"
    assert d.fixes[1] == "model.fc1.float()  # run `fc1` in float32"
    # a forward overflow: a loss scale moves gradients only, so no GradScaler is suggested
    assert len(d.fixes) == 2 and not any("GradScaler" in f for f in d.fixes)
    # finite in float32 but below the float16 maximum (an overflow inside the op): no false "above"
    below = replace(c.ev.headroom, float32_absmax=100.0)
    inside = precision.low_precision_overflow(replace(c, ev=replace(c.ev, headroom=below)))
    assert inside is not None and inside.evidence[1] == "in float32 the same op stays finite"
    f32 = replace(c, ev=replace(c.ev, dtype="float32"))
    assert precision.low_precision_overflow(f32) is None
    overflow32 = replace(c, ev=replace(c.ev, headroom=replace(c.ev.headroom, float32_finite=False,
                                                               float32_absmax=None)))
    assert precision.low_precision_overflow(overflow32) is None


def test_low_precision_fixes_are_python_and_fit_the_run() -> None:
    """The module as Python (``model.0`` is a syntax error), the op outside any module named with
    its line, and a GradScaler only for a backward overflow in a script that has none."""
    c = cases("torch")["low_precision_overflow"]
    seq = precision.low_precision_overflow(replace(c, ev=replace(c.ev, module="0")))
    assert seq is not None and seq.fixes[1] == "model[0].float()  # run `0` in float32"
    deep = precision.low_precision_overflow(replace(c, ev=replace(c.ev, module="enc.layers.3.attn")))
    assert deep is not None and deep.fixes[1].startswith("model.enc.layers[3].attn.float()")
    for fix in (seq.fixes[1], deep.fixes[1]):
        compile(fix, "<fix>", "exec")
    loose = precision.low_precision_overflow(replace(c, ev=replace(c.ev, module=None, op="aten.exp.default",
                                                                   source="train.py:12")))
    assert loose is not None
    assert loose.fixes[1] == "torch.exp(x.float())  # `exp` at train.py:12 in float32, x: its input"
    back = replace(c, ev=replace(c.ev, phase="backward"))
    d = precision.low_precision_overflow(back)
    assert d is not None and d.fixes[-1] == "scaler = torch.amp.GradScaler()  # for float16 gradients"
    scaled = precision.low_precision_overflow(replace(back, ctx=replace(back.ctx, loss_scaler=True)))
    assert scaled is not None and not any("GradScaler" in f for f in scaled.fixes)


@pytest.mark.parametrize(
    ("op", "ins", "scalars", "summary"),
    [
        ("aten.log.default", [stats(zeros=2)], {}, "`log` of zero"),
        ("aten.log.default", [stats(negatives=2)], {}, "`log` of a negative number"),
        ("aten.log1p.default", [stats(min=-1.0, max=0.0)], {}, "`log1p` of a value <= -1"),
        ("aten.div.Tensor", [stats("self", zeros=1), stats("other", zeros=1)], {}, "division by zero"),
        ("aten.div.Tensor", [stats("self", absmax=1.0), stats("other", smallest_abs_nonzero=1e-40)],
         {}, "division by zero"),
        ("aten.div.Scalar", [stats("self")], {"other": 0}, "division by zero"),
        ("aten.reciprocal.default", [stats(zeros=1)], {}, "division by zero"),
        ("aten.sqrt.default", [stats(negatives=1)], {}, "`sqrt` of a negative number"),
        ("aten.pow.Tensor_Scalar", [stats(negatives=1)], {"exponent": 0.5}, "`pow` of a negative number"),
        ("aten.pow.Tensor_Scalar", [stats(zeros=1)], {"exponent": -1}, "`pow` of 0 with a negative exponent"),
        ("aten.rsqrt.default", [stats(zeros=1)], {}, "`rsqrt` of 0 or a negative number"),
        ("aten.acos.default", [stats(absmax=1.5)], {}, "`acos` outside its domain [-1, 1]"),
        ("aten.exp.default", [stats(max=100.0)], {}, "`exp` overflowed"),
        ("aten.var.correction", [stats(numel=1)], {}, "`var` of a single element"),
        ("aten.xlogy.Tensor", [stats("x"), stats("y", zeros=1)], {}, "`xlogy` of a non-positive number"),
        ("aten._weight_norm_interface.default", [stats("v", zeros=8), stats("g", absmax=0.7)], {},
         "`_weight_norm_interface` divided by the norm of an all-zero `v`"),
    ],
)
def test_forward_singularities(op: str, ins: list, scalars: dict, summary: str) -> None:
    c = case("torch", phase="forward", op=op, nan=1, posinf=1, inputs=tuple(ins), scalars=scalars)
    d = singular.op_at_singularity(c)
    assert d is not None and d.cause is Cause.UNSAFE_OP and d.confidence == 0.9
    assert d.summary.startswith(summary)
    assert contradictions(d) == []
    # the same op on harmless inputs is no singularity
    assert singular.op_at_singularity(replace(c, ev=replace(c.ev, inputs=(stats(), stats()), scalars={}))) is None


@pytest.mark.parametrize(
    ("grad_fn", "summary"),
    [
        ("SqrtBackward0", "the backward of `sqrt` divided by zero"),
        ("LinalgVectorNormBackward0", "the backward of `norm` divided by zero"),
        ("PowBackward0", "the backward of `pow` at 0"),
        ("LogBackward0", "the backward of `log` at 0"),
        ("DivBackward0", "the backward of a division by a value near zero"),
        ("AcosBackward0", "the backward of `acos` at ±1"),
        ("StdBackward0", "the backward of `std` with zero spread"),
    ],
)
def test_backward_singularities(grad_fn: str, summary: str) -> None:
    c = case("torch", phase="backward", op="aten.div.Tensor", grad_fn=grad_fn, posinf=1,
             inputs=(stats("grad", zeros=2), stats("result", zeros=2)))
    d = singular.op_at_singularity(c)
    assert d is not None and d.summary.startswith(summary)
    assert "the forward pass was finite; the value was made in the backward" in d.evidence[-1]
    custom = replace(c, ev=replace(c.ev, op="aten.mul.Tensor",
                                   provenance=replace(c.ev.provenance, custom_function="MyFn")))
    assert singular.op_at_singularity(custom) is None  # a custom backward is judged as written


def test_weight_norm_of_a_zeroed_channel_is_an_unsafe_op_not_bad_init() -> None:
    """The issue's case in numbers: ``_weight_norm_interface`` over a ``v`` with a zeroed row,
    at the first step, the activations before it small."""
    f = Finding(
        phase="forward", op="aten._weight_norm_interface.default",
        module="fc1.parametrizations.weight.0", module_type="_WeightNorm", step=0,
        dtype="float32", shape=(16, 16), nan=16,
        inputs=[stats("v", numel=256, zeros=16, negatives=120, min=-0.35, max=0.35, absmax=0.35),
                stats("g", numel=16, min=0.47, max=0.7, absmax=0.7)],
        details={"first_step": True, "activation_scale": [("fc0", 2.15), ("fc1", math.nan)]},
    )
    d = diagnose(f)
    assert d.cause is Cause.UNSAFE_OP and d.rule == "op_at_singularity" and d.confidence == 0.9
    assert "its norm — the denominator — is 0" in d.evidence[0] and "0/0 = nan" in d.evidence[0]
    assert "original0" in d.fixes[0]
    assert contradictions(d) == []


def test_nonfinite_from_small_inputs_is_no_overflow() -> None:
    c = cases("torch")["nonfinite_from_small_inputs"]
    d = singular.nonfinite_from_small_inputs(c)
    assert d is not None and d.cause is Cause.UNSAFE_OP and d.confidence == 0.5
    assert "inputs holding zeros: `A` (16 of 16)" in d.evidence
    big = replace(c, ev=replace(c.ev, inputs=(stats("A", absmax=1e30),)))
    assert singular.nonfinite_from_small_inputs(big) is None
    half = replace(c, ev=replace(c.ev, dtype="float16"))
    assert singular.nonfinite_from_small_inputs(half) is None  # small float16 values can overflow


def test_first_step_rules() -> None:
    c = cases("torch")
    d = overflow.first_backward_overflow(c["first_backward_overflow"])
    assert d is not None and d.cause is Cause.EXPLODING_GRADIENTS and d.confidence == 0.7
    assert "the activations stayed small (at most 1.5)" in d.evidence
    assert overflow.first_backward_overflow(replace(c["first_backward_overflow"], trend=CALM)) is None

    d = overflow.first_step_overflow_small_activations(c["first_step_overflow_small_activations"])
    assert d is not None and d.cause is Cause.BAD_INITIALIZATION and d.confidence == 0.4
    d = overflow.initial_weights_overflow(c["initial_weights_overflow"])
    assert d is not None and d.confidence == 0.85
    assert d.evidence[-2] == "activation scale (max |x|) layer by layer at the first step: 10 → 1e+20 → inf"
    # ±Inf among the activations is large, not calm
    assert overflow.first_step_overflow_small_activations(c["initial_weights_overflow"]) is None


def test_history_rules() -> None:
    c = cases("torch")
    d = overflow.backward_overflow(c["backward_overflow"])
    assert d is not None and d.cause is Cause.EXPLODING_GRADIENTS and d.confidence == 0.8
    assert overflow.backward_overflow(replace(c["backward_overflow"], trend=GROWING)) is None

    d = overflow.updates_too_large(c["updates_too_large"])
    assert d is not None and d.cause is Cause.LEARNING_RATE_TOO_HIGH and d.confidence == 0.85
    assert "the weight norm grew 243x over the last 6 steps: 10 → 2.43e+03, ×3 per step" in d.evidence
    # sized from the measured update/weight ratio (0.4: ×1e-2/0.4), not a blind ÷4
    assert d.fixes[0] == "optimizer = torch.optim.SGD(model.parameters(), lr=0.25)  # was 10"
    assert overflow.updates_too_large(c["sudden_overflow"]) is None

    d = overflow.grad_norm_grew(c["grad_norm_grew"])
    assert d is not None and d.cause is Cause.EXPLODING_GRADIENTS and d.confidence == 0.75
    assert overflow.grad_norm_grew(c["sudden_overflow"]) is None

    d = overflow.sudden_overflow(c["sudden_overflow"])
    assert d.cause is Cause.LEARNING_RATE_TOO_HIGH and d.confidence == 0.4


def test_learning_rate_fixes_follow_the_schedule() -> None:
    base = cases("torch")["updates_too_large"]
    one = replace(base, ctx=replace(base.ctx, scheduler="OneCycleLR"))
    assert overflow.updates_too_large(one).fixes[0].startswith(  # type: ignore[union-attr]
        "lower the peak of your `OneCycleLR`: max_lr=2.5 (it reached 10)")
    varied = replace(base, trend=replace(base.trend, lrs=(1.0, 5.0, 10.0)))
    assert overflow.updates_too_large(varied).fixes[0].startswith("peak_lr = 2.5")  # type: ignore[union-attr]
    huge_loss = replace(base, trend=replace(base.trend, first_loss=(0, 3e7)))
    assert overflow.updates_too_large(huge_loss).fixes[0].startswith("y = (y - y.mean())")  # type: ignore[union-attr]
    k = cases("keras")["updates_too_large"]
    assert overflow.updates_too_large(replace(k, ctx=replace(k.ctx, scheduler="OneCycleLR"))).fixes == [  # type: ignore[union-attr]
        "optimizer = keras.optimizers.SGD(learning_rate=0.25)  # was 10",
        "optimizer = keras.optimizers.SGD(learning_rate=0.25, global_clipnorm=2)",
    ]
    flagged = replace(k, ctx=replace(k.ctx, argv=("--learning_rate", "10", "--epochs", "3")))
    assert overflow.updates_too_large(flagged).fixes[0] == (  # type: ignore[union-attr]
        "run it again with `--learning_rate 0.25` (it was `--learning_rate 10`): your learning rate comes "
        "from the command line")


def test_shrinking_weights_are_not_said_to_grow() -> None:
    c = cases("torch")["updates_too_large"]
    c = replace(c, trend=replace(c.trend, weights=Growth(10.0, 8.0, 0.8), weights_per_step=0.96))
    d = overflow.updates_too_large(c)
    assert d is not None and "the weight norm over the last 6 steps: 10 → 8" in d.evidence
    assert contradictions(d) == []


def test_the_order_of_the_table_decides_overlapping_cases() -> None:
    c = cases("torch")
    # data beats everything, even with a singular op name
    data = replace(c["op_at_singularity"], ev=replace(c["op_at_singularity"].ev, phase="data"))
    assert diagnose_case(data).rule == "batch_holds_nonfinite"
    # a float16 log that float32 would keep finite is low precision, not the singular point
    sing = c["op_at_singularity"].ev
    lp = replace(sing, dtype="float16", headroom=replace(sing.headroom, float32_finite=True))
    assert diagnose_case(replace(c["op_at_singularity"], ev=lp)).rule == "low_precision_overflow"
    # a singular op at the first step is the op, not the initialization
    first = replace(c["op_at_singularity"], trend=FIRST)
    assert diagnose_case(first).rule == "op_at_singularity"


def test_evidence_is_all_the_rules_read() -> None:
    """A finding and the Evidence written by hand give the same diagnosis."""
    f = Finding(phase="forward", op="aten.log.default", module="head", neginf=3,
                inputs=[stats("x", zeros=3, min=0.0, max=0.9, absmax=0.9)],
                details={"input_producers": ["aten._softmax.default"]})
    by_hand = case("torch", CALM, phase="forward", op="aten.log.default", module="head", neginf=3,
                   inputs=(stats("x", zeros=3, min=0.0, max=0.9, absmax=0.9),),
                   input_producers=("aten._softmax.default",))
    assert Evidence.of(f).to_dict() == by_hand.ev.to_dict()
    assert diagnose_case(by_hand).evidence == diagnose(f).evidence


def test_an_expansive_recurrence_is_bad_initialization_only_in_its_module_and_with_steady_weights() -> None:
    c = cases("torch")["expansive_recurrence"]
    d = overflow.expansive_recurrence(c)
    assert d is not None and d.cause is Cause.BAD_INITIALIZATION
    assert any("×1.36 per call" in e and "~296 calls" in e for e in d.evidence)
    assert "orthogonal_" in d.fixes[0]
    elsewhere = replace(c, ev=replace(c.ev, module="head"))  # not in the recurrence
    assert overflow.expansive_recurrence(elsewhere) is None
    assert diagnose_case(elsewhere).rule == "sudden_overflow"
    grown = replace(c, trend=GROWING)  # the weights grew: the learning rate, not the init
    assert overflow.expansive_recurrence(grown) is None
    backward = replace(c, ev=replace(c.ev, phase="backward"))  # exploding gradients, another rule
    assert overflow.expansive_recurrence(backward) is None
