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

__all__ = ["SCHEMA_VERSION", "STATUSES", "RunLog", "event_dict", "merge_ranks", "rank_from_env", "rank_path"]

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
    rank: int | None = None  # under torchrun: this process's rank ...
    world_size: int | None = None  # ... of this many

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
            **({"rank": self.rank, "world_size": self.world_size} if self.world_size else {}),
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


def rank_from_env(env: dict[str, str] | None = None) -> tuple[int, int] | None:
    """``(rank, world_size)`` under ``torchrun`` (its ``RANK``/``WORLD_SIZE``), else ``None``."""
    env = dict(os.environ) if env is None else env
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return (rank, world) if world > 1 and 0 <= rank < world else None


def rank_path(path: str, rank: int | None) -> str:
    """Where one rank writes what ``--json PATH`` / ``--report PATH`` asked for: rank 0 (and a
    run without ranks) at ``PATH``, rank ``r`` beside it at ``STEM.rank{r}.EXT`` — every rank
    gets the same command line, and none overwrites another's."""
    if not rank:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}.rank{rank}{ext}"


def _rank_siblings(path: str) -> list[str]:
    stem, ext = os.path.splitext(path)
    d = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(stem) + ".rank"
    found = []
    for name in os.listdir(d):
        mid = name[len(base):len(name) - len(ext)] if ext else name[len(base):]
        if name.startswith(base) and name.endswith(ext) and mid.isdigit():
            found.append((int(mid), os.path.join(d, name)))
    return [p for _, p in sorted(found)]


#: the worse status wins when ranks are merged
_SEVERITY = {"ok": 0, "recovered": 1, "interrupted": 2, "error": 3, "nonfinite": 4}


def merge_ranks(path: str) -> dict[str, Any]:
    """Rank 0's run log at ``path`` with every ``STEM.rank{r}.EXT`` beside it merged in: the
    events of all ranks (each says its ``rank``), the worst status, and one ``ranks`` entry per
    rank saying what it saw. A run without rank logs is returned as it is."""
    doc = RunLog.read(path)
    others = [RunLog.read(p) for p in _rank_siblings(path)]
    if not others:
        return doc
    docs = [doc, *others]
    ranks = []
    for i, d in enumerate(docs):
        r = d.get("rank", i)
        for ev in d.get("events", []):
            ev.setdefault("rank", r)
            if ev.get("rank") is None:
                ev["rank"] = r
        ranks.append({"rank": r, "status": d.get("status"), "steps": d.get("steps"),
                      "exit_code": d.get("exit_code"), "events": len(d.get("events", [])),
                      "first_event_step": (d.get("events") or [{}])[0].get("step")})
    merged = dict(doc)
    merged["status"] = max((d.get("status", "ok") for d in docs), key=lambda x: _SEVERITY.get(x, 0))
    merged["events"] = sorted((ev for d in docs for ev in d.get("events", [])),
                              key=lambda ev: (ev.get("step") is None, ev.get("step") or 0, ev["rank"]))
    merged["recoveries"] = [dict(rec, rank=d.get("rank", i)) for i, d in enumerate(docs)
                            for rec in d.get("recoveries", [])]
    merged["ranks"] = ranks
    merged["notes"] = [*doc.get("notes", []), *(
        f"rank {x['rank']}: {x['status']}, {x['steps']} steps, {x['events']} non-finite event(s)"
        + (f", the first at step {x['first_event_step']}" if x["events"] else "") for x in ranks)]
    return merged
