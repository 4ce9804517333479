"""The run log: what ``nanguard run --json`` writes, schema version 1.

Written once, at the end of a run — healthy, recovered, stopped on a non-finite value, crashed or
interrupted — atomically (a temporary file renamed into place). The schema is documented in
``docs/runlog.md``; fields are only ever added within a version.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from .._version import __version__
from .diagnosis import Diagnosis
from .finding import Finding
from .history import History

__all__ = ["SCHEMA_VERSION", "STATUSES", "RunLog", "event_dict"]

SCHEMA_VERSION = 1
#: ``ok``: no non-finite value; ``nonfinite``: stopped on one; ``recovered``: met some, finished;
#: ``error``: the script raised something else; ``interrupted``: Ctrl-C / SIGTERM.
STATUSES = ("ok", "nonfinite", "recovered", "error", "interrupted")


def _json_safe(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def event_dict(f: Finding, d: Diagnosis | None) -> dict[str, Any]:
    """One entry of ``events``: the finding's fields, then the diagnosis's."""
    ev: dict[str, Any] = {
        "step": f.step,
        "phase": f.phase,
        "op": f.op,
        "grad_fn": f.grad_fn,
        "module": f.module,
        "module_type": f.module_type,
        "source": f.source,
        "source_code": f.source_code,
        "dtype": f.dtype,
        "shape": list(f.shape),
        "nan": f.nan,
        "posinf": f.posinf,
        "neginf": f.neginf,
        "reached": f.reached,
        "detected_by": f.detected_by,
        "framework": f.framework,
        "rank": f.rank,
        "cause": d.cause.value if d else None,
        "confidence": round(d.confidence, 2) if d else None,
        "summary": d.summary if d else None,
        "evidence": list(d.evidence) if d else [],
        "fixes": list(d.fixes) if d else [],
        "rule": d.rule if d else None,
        "inputs": [s.to_dict() for s in f.inputs],
        "scalars": dict(f.scalars),
        "details": dict(f.details),
    }
    out: dict[str, Any] = _json_safe(ev)
    return out


@dataclass
class RunLog:
    """Everything a run log holds; :meth:`to_dict` is the JSON document."""

    status: str = "ok"
    steps: int = 0
    script: str | None = None
    argv: list[str] = field(default_factory=list)
    exit_code: int | None = None
    framework: str | None = None
    events: list[tuple[Finding, Diagnosis | None]] = field(default_factory=list)
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    history: History | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    started: float | None = None
    duration_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        return {
            "schema": SCHEMA_VERSION,
            "nanguard": __version__,
            "status": self.status,
            "steps": self.steps,
            "script": self.script,
            "argv": list(self.argv),
            "exit_code": self.exit_code,
            "framework": self.framework,
            "duration_s": round(self.duration_s, 3) if self.duration_s is not None else None,
            "events": [event_dict(f, d) for f, d in self.events],
            "recoveries": _json_safe(self.recoveries),
            "error": self.error,
            "notes": list(self.notes),
            "history": self.history.to_list() if self.history is not None else [],
        }

    def write(self, path: str) -> None:
        """Write atomically: readers never see half a file."""
        data = json.dumps(self.to_dict(), indent=1, allow_nan=False)
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".nanguard-", suffix=".json", dir=d)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(data + "\n")
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @staticmethod
    def read(path: str) -> dict[str, Any]:
        with open(path) as fh:
            doc: dict[str, Any] = json.load(fh)
        if doc.get("schema") != SCHEMA_VERSION:
            raise ValueError(
                f"{path}: run log schema {doc.get('schema')!r}; this nanguard reads schema "
                f"{SCHEMA_VERSION}"
            )
        return doc
