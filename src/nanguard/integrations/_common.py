"""What the trainer callbacks share: the run log and the HTML report at the end of training."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from ..core.diagnosis import Diagnosis
from ..core.finding import Finding
from ..core.history import History
from ..core.runlog import RunLog

__all__ = ["RunRecord"]


class RunRecord:
    """A callback's outputs: its ``history``, ``findings`` and ``recoveries`` → run log / HTML
    report, written once, when training ends (or stops on a finding), by rank 0."""

    def __init__(self, report_path: str | None = None, json_path: str | None = None) -> None:
        self.report_path = report_path
        self.json_path = json_path
        self._t0 = time.perf_counter()
        self._written = False

    def run_log(self, status: str, history: History, findings: Sequence[tuple[Finding, Diagnosis | None]],
                recoveries: Sequence[dict[str, Any]], error: str | None = None,
                outcome: dict[str, Any] | None = None) -> RunLog:
        """The run so far as a :class:`~nanguard.core.runlog.RunLog` (what the report shows)."""
        steps = max((r.step + 1 for r in history), default=0)
        return RunLog(
            status=status, steps=steps, script=" ".join(sys.argv[:1]) or None, argv=sys.argv[1:],
            framework="torch", events=list(findings), recoveries=list(recoveries),
            history=history, error=error, duration_s=time.perf_counter() - self._t0, outcome=outcome,
        )

    def write(self, status: str, history: History, findings: Sequence[tuple[Finding, Diagnosis | None]],
              recoveries: Sequence[dict[str, Any]], error: str | None = None,
              outcome: dict[str, Any] | None = None) -> None:
        """Write the run log and the report where asked (once; later calls do nothing)."""
        if self._written or not (self.report_path or self.json_path):
            return
        self._written = True
        log = self.run_log(status, history, findings, recoveries, error, outcome)
        if self.json_path:
            log.write(self.json_path)
        if self.report_path:
            from ..core.report_html import write_report

            write_report(log, self.report_path)
