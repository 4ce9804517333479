"""Typed evidence (``core.evidence``) and trends (``core.trends``): read from plain findings and
histories, and unchanged by a round trip through the run log's JSON."""

from __future__ import annotations

import json
import math

import pytest

from nanguard.core.evidence import Evidence, MaskSource, Sample, Update
from nanguard.core.finding import Finding, TensorStats
from nanguard.core.history import History, StepRecord
from nanguard.core.runlog import event_dict
from nanguard.core.trends import Growth, Trends, clip_threshold


def _stats(name: str = "x", **kw: object) -> TensorStats:
    return TensorStats(name=name, dtype="float32", shape=(4, 4), numel=16, **kw)  # type: ignore[arg-type]


FINDINGS = [
    Finding(phase="data", op="input", step=3, dtype="float32", shape=(8, 3, 4), nan=2,
            details={"origin": "data", "input_name": "x", "entered": "conv (Conv2d)",
                     "samples": [{"index": 5, "kind": "NaN", "features": [(0, 1, 2), (0, 2, 2)]},
                                 {"index": 6, "kind": "Inf"}],
                     "batch_final": True}),
    Finding(phase="forward", op="aten.log.default", module="head", module_type="Linear",
            source="m.py:3", step=0, dtype="float32", shape=(4, 4), neginf=3,
            inputs=[_stats(zeros=3, min=0.0, max=0.9, absmax=0.9, smallest_abs_nonzero=1e-3)],
            details={"input_producers": ["aten._softmax.default"], "first_step": True,
                     "activation_scale": [("fc1", 2.0), ("fc2", math.nan), ("<Net>", math.inf)],
                     "relu_grad": "TensorFlow's old ...", "relu_grad_layer": "the Net",
                     "micro_batch": "1 of 4 (batch_idx 0)"}),
    Finding(phase="optimizer", op="Adam.step", module="fc", step=7, nan=4, detected_by="watch",
            details={"parameters": ["fc.weight"], "optimizer_state": ["fc.weight:exp_avg_sq"],
                     "grads_finite": True, "grad_norm": math.inf, "note": "not replayed"}),
    Finding(phase="backward", op="aten.linalg_vector_norm.default", grad_fn="LinalgVectorNormBackward0",
            posinf=1, reached="total gradient norm that clip_grad_norm_ returned",
            details={"sink": "total gradient norm that clip_grad_norm_ returned",
                     "clip_total_norm": math.inf, "float32_finite": False, "float32_absmax": 7e4}),
    Finding(phase="forward", op="aten._softmax.default", nan=8, scalars={"dim": -1},
            details={"from_masked_inf": {"op": "aten.masked_fill.Scalar", "source": "a.py:9",
                                         "module": "attn"}, "constant": "-inf", "parameters": []}),
]


def _json_trip(f: Finding) -> Finding:
    """What ``nanguard report`` reads back: the run log's event, through JSON."""
    return Finding.from_dict(json.loads(json.dumps(event_dict(f, None), allow_nan=False)))


@pytest.mark.parametrize("f", FINDINGS, ids=lambda f: f.phase + "-" + str(f.op))
def test_evidence_survives_the_run_log(f: Finding) -> None:
    ev = Evidence.of(f)
    assert Evidence.of(_json_trip(f)).to_dict() == ev.to_dict()
    back = Evidence.from_dict(json.loads(json.dumps(ev.to_dict(), allow_nan=False)))
    assert back.to_dict() == ev.to_dict()
    # details come back as they went in (JSON-safe), less empty values
    safe = json.loads(json.dumps(event_dict(f, None)))["details"]
    assert ev.to_dict()["details"] == {k: v for k, v in safe.items() if v not in ([], None)}


def test_details_are_typed() -> None:
    ev = Evidence.of(FINDINGS[0])
    came = ev.provenance
    assert came.origin == "data" and came.input_name == "x" and came.entered == "conv (Conv2d)"
    assert came.samples == (Sample(5, "NaN", ((0, 1, 2), (0, 2, 2))), Sample(6, "Inf", None))
    assert ev.notes.other == {"batch_final": True}
    ev = Evidence.of(FINDINGS[1])
    assert ev.headroom.first_step and ev.producers == ["softmax"] and ev.op_name == "log"
    scale = ev.headroom.activation_scale
    assert scale[0] == ("fc1", 2.0) and math.isnan(scale[1][1])
    assert ev.activation_peak == math.inf  # a NaN says nothing about scale; inf is the largest
    ev = Evidence.of(FINDINGS[2])
    assert ev.update.grads_finite is True and ev.update.grad_norm == math.inf
    assert ev.provenance.optimizer_state == ("fc.weight:exp_avg_sq",) and ev.notes.note == "not replayed"
    ev = Evidence.of(FINDINGS[3])
    assert ev.clip_overflow and ev.forward_op == "norm"  # canonical
    assert ev.headroom.float32_finite is False and ev.headroom.float32_absmax == 7e4
    ev = Evidence.of(FINDINGS[4])
    assert ev.provenance.masked_inf == MaskSource("aten.masked_fill.Scalar", "a.py:9", "attn")
    assert ev.provenance.constant == "-inf" and ev.provenance.parameters == ()


def test_numbers_written_as_strings_by_the_run_log_are_read_back() -> None:
    f = Finding(phase="optimizer", op="Adam.step",
                details={"grad_norm": "inf", "clip_total_norm": "nan",
                         "activation_scale": [["fc", "-inf"]]})
    ev = Evidence.of(f)
    assert ev.update.grad_norm == math.inf and ev.clip_overflow
    assert ev.headroom.activation_scale == (("fc", -math.inf),)


def test_a_finite_clip_norm_is_no_overflow() -> None:
    assert not Evidence(phase="backward", update=Update(clip_total_norm=3.0)).clip_overflow
    assert not Evidence(phase="backward").clip_overflow


def test_finding_evidence_property_and_descriptions() -> None:
    f = FINDINGS[1]
    assert f.evidence.to_dict() == Evidence.of(f).to_dict()
    assert f.evidence.what == f.what == "3 -Inf in float32[4, 4]"
    assert f.evidence.where == "in `head` (m.py:3)"
    assert Evidence(phase="forward", module="").where == "in the model's own forward"
    assert Evidence(phase="forward").where == "in your code"


def test_trends_from_a_history() -> None:
    h = History()
    for i in range(10):
        h.append(StepRecord(step=i, loss=1.0 + i, grad_norm=1.0, param_norm=2.0 * 1.5**i,
                            lr=0.1, update_norm=0.2))
    h.append(StepRecord(step=10, loss=math.nan, finite=False))
    t = Trends.of(h)
    assert t.healthy_steps == 10 and t.window == 8
    assert t.weights is not None and t.weights.factor == pytest.approx(1.5**7)
    assert t.weights_per_step == pytest.approx(1.5) and t.weights_grew
    assert t.grads == Growth(1.0, 1.0, 1.0) and not t.grads_grew
    assert t.first_loss == (0, 1.0) and t.last_grad_norm == 1.0
    assert t.lrs == (0.1,) * 10 and not t.schedule_varied
    assert t.median_update_ratio == pytest.approx(0.2 / (2.0 * 1.5**4)) and not t.big_updates
    assert Trends.of(History()) == Trends()


def test_clip_threshold_from_the_calm_norms() -> None:
    assert clip_threshold([]) == 1.0
    assert clip_threshold([0.8, 0.9, 1.1, 1.2, 400.0]) == 1.0
    assert clip_threshold([30.0, 31.0, 35.0]) == 40.0
