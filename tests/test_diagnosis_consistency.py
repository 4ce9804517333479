"""Over many plain-number cases: no diagnosis cites evidence that denies its cause, no framework's
spelling reaches the other's user, and the core keeps its shape (short functions, no framework)."""

from __future__ import annotations

import ast
import math
import random
from pathlib import Path

import pytest

from _rule_cases import KERAS_WORDS, TORCH_WORDS, case, contradictions, stats
from nanguard.core import RULES
from nanguard.core.case import Case, RunContext
from nanguard.core.diagnosis import diagnose_case
from nanguard.core.evidence import MaskSource, Sample
from nanguard.core.trends import Growth, Trends

CORE = Path(__file__).resolve().parent.parent / "src" / "nanguard" / "core"

_OPS = {
    "torch": ["aten.log.default", "aten.div.Tensor", "aten.sqrt.default", "aten.pow.Tensor_Scalar",
              "aten.rsqrt.default", "aten.acos.default", "aten.exp.default", "aten.var.correction",
              "aten.addmm.default", "aten.mm.default", "aten.addcmul_.default", "aten._softmax.default",
              "aten._weight_norm_interface.default", "aten.log1p.default", "aten.xlogy.Tensor", None,
              "parameter", "input", "Adam.step"],
    "keras": ["Log", "RealDiv", "Sqrt", "Pow", "Rsqrt", "Acos", "Exp", "MatMul", "Mul", "Softmax",
              "Log1p", "Xlogy", "AddV2", None, "parameter", "input", "Adam.apply"],
}
_GRAD_FN = {"torch": ["SqrtBackward0", "LogBackward0", "DivBackward0", "MmBackward0", "PowBackward0"],
            "keras": ["_SqrtGrad", "_LogGrad", "_RealDivGrad", "_MatMulGrad"]}


def _random_case(r: random.Random, fw: str) -> Case:
    def maybe(p: float, v: object) -> object:
        return v if r.random() < p else None

    ins = tuple(
        stats(f"in{i}", numel=r.choice([1, 16]), zeros=r.choice([0, 0, 2]), negatives=r.choice([0, 3]),
              min=r.choice([None, -2.0, 0.0]), max=r.choice([None, 0.5, 100.0]),
              absmax=r.choice([None, 0.5, 2.0, 1e5, 1e30]), smallest_abs_nonzero=r.choice([None, 1e-3, 1e-42]))
        for i in range(r.choice([0, 1, 2, 3]))
    )
    phase = r.choice(["data", "forward", "forward", "backward", "optimizer"])
    scale = r.choice([(), (("a", 1.0), ("b", 5.0)), (("a", 1.0), ("b", 1e25), ("c", math.inf)),
                      (("a", 2.0), ("b", math.nan))])
    trend = r.choice([
        Trends(),
        Trends(healthy_steps=12, weights=Growth(1.0, r.choice([1.05, 0.7, 30.0]), 1.0),
               weights_per_step=r.choice([1.0, 1.6, 0.9]), grads=Growth(1.0, 50.0, r.choice([1.0, 50.0])),
               grads_long=Growth(1.0, 50.0, r.choice([1.0, 50.0])), loss=Growth(1.0, 5.0, r.choice([0.5, 5.0])),
               median_update_ratio=r.choice([None, 1e-3, 0.2]), recent_update_ratios=(0.01,),
               grad_norms=(1.0, 2.0), lrs=(0.1, r.choice([0.1, 0.5])), last_grad_norm=2.0,
               first_loss=(0, r.choice([1.0, 3e7]))),
    ])
    # a weights Growth must agree with itself: fix its factor
    if trend.weights is not None:
        w = trend.weights
        trend = Trends(**{**trend.__dict__, "weights": Growth(w.first, w.last, w.last / w.first)})
    ctx = RunContext(framework=fw, optimizer=r.choice([None, "Adam", "SGD"]),
                     hyper=r.choice([{}, {"lr": 0.5}, {"lr": 1e-3, "eps": 0.0}]),
                     clip_norm=r.choice([None, 1.0]), scheduler=r.choice([None, "OneCycleLR", "StepLR"]))
    return case(
        fw, trend, ctx, phase=phase, op=r.choice(_OPS[fw]),
        grad_fn=r.choice(_GRAD_FN[fw]) if phase == "backward" else None,
        module=r.choice([None, "", "fc1", "rnn"]), module_type=r.choice([None, "Linear"]),
        step=r.choice([None, 0, 7]), dtype=r.choice(["float32", "float16", None]), shape=(4, 4),
        nan=r.choice([0, 3]), posinf=r.choice([0, 2]), neginf=r.choice([0, 1]), inputs=ins,
        scalars=r.choice([{}, {"exponent": 0.5}, {"exponent": -1.0}, {"other": 0}]),
        origin=maybe(0.05, r.choice(["data", "parameter"])), parameters=r.choice([(), ("fc.weight",)]),
        samples=r.choice([(), (Sample(2, "NaN", (1,)),)]), constant=maybe(0.05, r.choice(["-inf", "nan"])),
        masked_inf=maybe(0.05, MaskSource("m", "a.py:1", None)),
        clip_total_norm=maybe(0.05, math.inf), grad_norm=maybe(0.2, r.choice([1.0, 1e25])),
        grads_finite=maybe(0.3, r.choice([True, False])), float32_finite=maybe(0.2, r.choice([True, False])),
        float32_absmax=maybe(0.2, r.choice([50.0, 7e4])), activation_scale=scale,
        first_step=r.random() < 0.2, input_producers=r.choice([(), ("aten._softmax.default",), ("Sigmoid",)]),
    )


@pytest.mark.parametrize("fw", ["torch", "keras"])
def test_no_diagnosis_denies_its_cause(fw: str) -> None:
    r = random.Random(13)
    used: set[str] = set()
    for _ in range(1500):
        d = diagnose_case(_random_case(r, fw))
        used.add(d.rule or "")
        assert contradictions(d) == [], (d.rule, d.cause, d.evidence)
        words = TORCH_WORDS if fw == "keras" else KERAS_WORDS
        for text in [d.summary, *d.fixes]:
            assert not words.search(text), (d.rule, text)
    assert len(used) >= len(RULES) - 3  # the grid reaches (almost) every rule


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_core_functions_are_short_and_framework_free() -> None:
    long, imports = [], []
    for path in sorted(CORE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in _functions(tree):
            n = (fn.end_lineno or fn.lineno) - fn.lineno + 1
            if n > 80:
                long.append(f"{path.name}:{fn.name} ({n} lines)")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and (node.end_lineno or 0) - node.lineno + 1 > 400:
                long.append(f"{path.name}: class {node.name}")
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            imports += [f"{path.name}: {m}" for m in names
                        if m.split(".")[0] in ("torch", "tensorflow", "keras")]
    assert long == []
    assert imports == []


def test_rules_read_no_raw_details() -> None:
    """The rules read typed evidence only: no ``details`` key lookups in core's rules."""
    offenders = []
    for path in [CORE / "diagnosis.py", *sorted((CORE / "rules").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "details":
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []
