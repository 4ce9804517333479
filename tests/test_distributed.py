"""DDP with gloo, 2 processes: one rank's NaN makes every rank act on the same step."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(tmp_path: Path, policy: str) -> list[dict[str, object]]:
    out = tmp_path / "ddp"
    proc = subprocess.run(
        [sys.executable, str(HERE / "ddp_worker.py"), str(out), policy, str(_free_port())],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((tmp_path / f"ddp.rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["skip", "recover"])
def test_every_rank_skips_the_same_step(tmp_path: Path, policy: str) -> None:
    r0, r1 = _run(tmp_path, policy)
    assert r0["skipped"] == r1["skipped"] == [2]
    for r in (r0, r1):
        assert r["finite"] is True
        (finding,) = r["findings"]
        assert finding[0] == 1 and finding[1] == "data"  # both name rank 1
    assert r0["weights"] == r1["weights"]  # still in sync


@pytest.mark.slow
def test_raise_stops_every_rank_without_hanging(tmp_path: Path) -> None:
    r0, r1 = _run(tmp_path, "raise")
    assert r0["error"] == r1["error"] == {"rank": 1, "phase": "data"}
