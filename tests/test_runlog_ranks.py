"""What each rank of a torchrun job prints: its lines led by its rank, each in one write, and a
rank other than 0 one line at the end where rank 0 prints the finding."""

from __future__ import annotations

import io

import pytest

from nanguard.core.diagnosis import Diagnosis
from nanguard.core.errors import NonFiniteError
from nanguard.core.finding import Finding
from nanguard.core.ranks import rank_prefix, say
from nanguard.core.runlog import RunLog
from nanguard.core.taxonomy import Cause
from nanguard.runner import RunOptions, _other_rank_line


class _Writes(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, s: str) -> int:
        self.calls.append(s)
        return super().write(s)


def test_the_prefix_names_the_rank_only_when_there_are_several() -> None:
    assert rank_prefix({"RANK": "1", "WORLD_SIZE": "2"}) == "[rank 1] "
    assert rank_prefix({"RANK": "0", "WORLD_SIZE": "2"}) == "[rank 0] "
    assert rank_prefix({"RANK": "0", "WORLD_SIZE": "1"}) == ""
    assert rank_prefix({}) == ""


def test_a_line_is_written_whole_with_its_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    out = _Writes()
    say("nanguard: warning at step 1 (loss-diverging): …", file=out)
    assert out.calls == ["[rank 3] nanguard: warning at step 1 (loss-diverging): …\n"]


def _err() -> NonFiniteError:
    f = Finding(framework="torch", step=2, phase="forward", op="aten.mse_loss.default", module=None,
                rank=0)
    d = Diagnosis(cause=Cause.LEARNING_RATE_TOO_HIGH, confidence=0.85, summary="updates too large")
    return NonFiniteError(f, d)


def test_another_rank_says_where_the_finding_is_printed() -> None:
    log = RunLog(script="train.py", argv=[], started=0.0)
    log.rank, log.world_size = 1, 2
    line = _other_rank_line(_err(), log, RunOptions(json_path="out/run.json"))
    assert line == ("nanguard: stopped at step 2 on a non-finite value made on rank 0 "
                    "(`aten.mse_loss.default`, forward pass; learning-rate-too-high): rank 0 prints "
                    "the finding; this rank's run log: out/run.rank1.json")
    log.status = "ok"
    assert _other_rank_line(None, log, RunOptions()) is None  # a healthy rank says nothing
    log.status, log.events = "recovered", [(_err().finding, None)]
    assert _other_rank_line(None, log, RunOptions()) == (
        "nanguard: recovered after 1 non-finite step(s), 0 recovery action(s): rank 0 prints the summary")
