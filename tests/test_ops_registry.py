"""``core/ops.py`` is the one place for op knowledge and dtype limits.

* The diagnosis' singularity checks (``core/rules/singular.py``) register into it by decorator,
  and the table's ``singular`` / ``backward_singular`` traits say in words what they check: the
  two are kept in step here, with the gaps between them named, each with its reason.
* The largest value of each dtype is written once, in :data:`nanguard.core.ops.DTYPE_MAX`; no
  other module spells it (or its logarithm) as a number.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

import nanguard.core.rules.singular as singular
from nanguard.core import early, evidence, hazards, ops
from nanguard.datascan import FLOAT16_MAX

SRC = Path(__file__).resolve().parent.parent / "src" / "nanguard"

#: the table names a forward singular point that no registered check judges
FORWARD_GAPS = {
    # a row of a softmax that is -inf everywhere is judged by inputs.mask_row_became_nan, which
    # needs the adapter's evidence of where the -inf came from (the mask), not a check by op
    "softmax", "log_softmax",
    # no check yet: a NaN from finite, small inputs of these goes to the catch-all
    # singular.nonfinite_from_small_inputs ("the op met a singular point"), larger ones to the
    # overflow rules; the trait documents the op (and serves a custom op's register_op_traits)
    "acosh", "binary_cross_entropy", "digamma", "erfinv", "lgamma", "logit", "logsumexp",
    "polygamma", "tan", "xlog1py",
}
#: the table names a singular point of the derivative that no registered backward check judges
#: (no check yet: their autograd nodes, VarMeanBackward0, CdistBackward0, Atan2Backward0, go to
#: the overflow rules)
BACKWARD_GAPS = {"atan2", "cdist", "std_mean", "var_mean"}


def _table() -> dict[str, ops.OpTraits]:
    return dict(ops._BUILTIN)


def test_every_registered_check_has_its_trait_in_the_table() -> None:
    forward = ops.singularity_ops()
    backward = ops.singularity_ops(backward=True)
    assert forward and backward
    assert sorted(n for n in forward if not ops.op_traits(n).singular) == []
    # a derivative is singular where the op is (log at 0) or where only it is (sqrt at 0)
    assert sorted(n for n in backward
                  if not (ops.op_traits(n).backward_singular or ops.op_traits(n).singular)) == []


def test_every_singular_trait_has_a_check_but_the_named_gaps() -> None:
    forward = ops.singularity_ops()
    backward = ops.singularity_ops(backward=True)
    table = _table()
    # equality, not inclusion: a gap closed by a new check must leave the list
    assert {n for n, t in table.items() if t.singular and n not in forward} == FORWARD_GAPS
    assert {n for n, t in table.items() if t.backward_singular and n not in backward} == BACKWARD_GAPS


def test_the_lookup_reads_any_spelling_and_keeps_forward_and_backward_apart() -> None:
    log = ops.singularity_check("log")
    assert log is not None and log.__module__ == singular.__name__
    assert ops.singularity_check("aten.log_.default") is log
    assert ops.singularity_check("Log") is log  # a TensorFlow op type
    assert ops.singularity_check("log", backward=True) not in (None, log)
    assert ops.singularity_check("linalg_vector_norm", backward=True) is ops.singularity_check("sqrt", backward=True)
    assert ops.singularity_check("relu") is None and ops.singularity_check(None) is None
    # weight normalization's v / ‖v‖: every op ops.norm_divisor knows has its check
    for name in ops._NORM_DIVISORS:
        assert ops.norm_divisor(name) is not None and ops.singularity_check(name) is not None


def test_registering_names_a_check_and_again_replaces_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "_SINGULARITIES", dict(ops._SINGULARITIES))

    @ops.register_singularity("mylib_fast_rsqrt", backward=True)
    def first(case: object) -> None:
        return None

    assert ops.singularity_check("mylib_fast_rsqrt", backward=True) is first
    assert ops.singularity_check("mylib_fast_rsqrt") is None
    assert "mylib_fast_rsqrt" in ops.singularity_ops(backward=True)

    @ops.register_singularity("mylib_fast_rsqrt", backward=True)
    def second(case: object) -> None:
        return None

    assert ops.singularity_check("mylib_fast_rsqrt", backward=True) is second


def test_ops_imports_nothing_of_nanguard() -> None:
    """ops is the lowest layer of the core: the rules import it, never the reverse (the checks
    register themselves when their module is imported)."""
    tree = ast.parse((SRC / "core" / "ops.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert not node.level and (node.module or "").split(".")[0] != "nanguard", ast.dump(node)
        elif isinstance(node, ast.Import):
            assert all(a.name.split(".")[0] != "nanguard" for a in node.names)


def test_the_rules_decide_by_traits() -> None:
    assert ops.op_traits("aten._softmax.default").softmax and ops.op_traits("LogSoftmax").softmax
    assert not ops.op_traits("logsumexp").softmax
    assert ops.op_traits("aten.addcmul_.default").squares and ops.op_traits("Square").squares
    assert not ops.op_traits("add").squares


# --- dtype limits -----------------------------------------------------------------------------


def test_the_log_of_each_maximum_is_computed_from_the_table() -> None:
    assert ops.LOG_MAX.keys() == ops.DTYPE_MAX.keys()
    for name, top in ops.DTYPE_MAX.items():
        assert ops.LOG_MAX[name] == math.log(top) == ops.exp_overflow(name)
    assert ops.exp_overflow("torch.half") == ops.LOG_MAX["float16"] and ops.exp_overflow(None) is None
    # the rounded values the messages print
    assert [f"{ops.LOG_MAX[n]:.2f}" for n in ("float16", "bfloat16", "float32", "float64")] == [
        "11.09", "88.72", "88.72", "709.78"]


def test_every_module_reads_the_one_table() -> None:
    assert hazards.MAX is ops.DTYPE_MAX
    assert ops.DTYPE_MAX["float16"] == FLOAT16_MAX
    assert evidence.Evidence(phase="forward", dtype="bfloat16").dtype_max == ops.DTYPE_MAX["bfloat16"]
    assert evidence.Evidence(phase="forward", dtype="float32").dtype_max is None
    assert not hasattr(early, "FLOAT32_MAX") and not hasattr(singular, "_DTYPE_MAX")


#: the largest value of a dtype, or its log, as a number: exact or rounded as the copies had them
_LIMITS = {65504.0, 3.39e38, 3.4e38, 3.3895313892515355e38, 3.4028234663852886e38, 1.8e308,
           1.7976931348623157e308, 88.72, 11.09, 709.78}


def _literals(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value in _LIMITS:
            out.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value!r}")
    return out


def test_no_module_spells_a_dtype_limit_but_ops() -> None:
    found = {str(p.relative_to(SRC)): _literals(p) for p in sorted(SRC.rglob("*.py"))}
    found = {k: v for k, v in found.items() if v}
    rest = [line for k, v in found.items() if k != "core/ops.py" for line in v]
    assert not rest, "dtype limits spelled outside nanguard.core.ops.DTYPE_MAX:\n" + "\n".join(rest)
