"""The run log: what ``nanguard run --json`` writes, schema version 1.

Written once, at the end of a run — healthy, recovered, stopped on a non-finite value, crashed or
interrupted — atomically (a temporary file renamed into place). The schema is documented in
``docs/runlog.md``; fields are only ever added within a version.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from .._version import __version__
from .diagnosis import Diagnosis
from .finding import Finding
from .history import History
from .outfile import write_atomic

__all__ = ["SCHEMA_VERSION", "STATUSES", "RunLog", "check_document", "event_dict", "finished_status"]

SCHEMA_VERSION = 1
#: ``ok``: no non-finite value; ``nonfinite``: stopped on one; ``recovered``: met some, finished,
#: and the loss came back to the run's healthy level (``outcome``); ``not-recovered``: met some,
#: finished, but the loss did not come back; ``unjudged``: met some, finished, and whether it
#: came back cannot be told (too few healthy steps before or after the event: never a failure);
#: ``error``: the script raised something else; ``interrupted``: Ctrl-C / SIGTERM.
STATUSES = ("ok", "nonfinite", "recovered", "unjudged", "not-recovered", "error", "interrupted")


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
        "trials": list(d.trials) if d else [],
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
    outcome: dict[str, Any] | None = None  # the judged outcome of the recoveries (core.outcome)
    warnings: list[dict[str, Any]] = field(default_factory=list)  # early warnings (core.early)
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
            "outcome": _json_safe(self.outcome),
            "warnings": _json_safe(self.warnings),
            "error": self.error,
            "notes": list(self.notes),
            "history": self.history.to_list() if self.history is not None else [],
            **({"rank": self.rank, "world_size": self.world_size} if self.world_size else {}),
        }

    def write(self, path: str) -> None:
        """Write atomically (readers never see half a file), with the permissions of any file
        the user writes. The folder must exist."""
        data = json.dumps(self.to_dict(), indent=1, allow_nan=False)
        write_atomic(path, data + "\n", suffix=".json")

    @staticmethod
    def read(path: str) -> dict[str, Any]:
        """The JSON document of a run log, checked (``ValueError`` naming what is wrong: not a
        JSON object, another schema, a field of the wrong type)."""
        with open(path) as fh:
            doc = json.load(fh)
        if not isinstance(doc, dict):
            raise ValueError(f"a run log is a JSON object; {path} holds a {_kind(doc)}")
        if doc.get("schema") != SCHEMA_VERSION:
            raise ValueError(
                f"{path}: run log schema {doc.get('schema')!r}; this nanguard reads schema "
                f"{SCHEMA_VERSION}"
            )
        problems = check_document(doc)
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            raise ValueError("; ".join(problems[:3]) + more)
        return doc


def finished_status(outcome: dict[str, Any] | None) -> str:
    """The status of a run that finished after meeting non-finite values, by its outcome's
    verdict: ``recovered`` only when the loss came back; ``not-recovered``; ``unjudged`` when it
    cannot be told (never ``recovered`` on what cannot be told)."""
    verdict = outcome.get("status") if outcome is not None else None
    return verdict if verdict in ("not-recovered", "unjudged") else "recovered"


# ----------------------------------------------------------------------------------------------
# checking a run log read back (nanguard report): every field the report reads, by type

_NUM = (int, float)
_STR = (str, type(None))
_OPT_INT = (int, type(None))
_OPT_NUM = (int, float, type(None))
_VALUE = (int, float, str, type(None))  # a history value: a number, "nan"/"inf", or absent
_TOP: dict[str, tuple[type, ...]] = {
    "status": (str,), "steps": (int,), "script": _STR, "argv": (list,), "exit_code": _OPT_INT,
    "framework": _STR, "duration_s": _OPT_NUM, "events": (list,), "recoveries": (list,),
    "error": _STR, "notes": (list,), "history": (list,), "outcome": (dict, type(None)),
    "warnings": (list,),
}
_EVENT: dict[str, tuple[type, ...]] = {
    "step": _OPT_INT, "phase": (str,), "op": _STR, "grad_fn": _STR, "module": _STR,
    "module_type": _STR, "source": _STR, "source_code": _STR, "dtype": _STR, "shape": (list,),
    "nan": (int,), "posinf": (int,), "neginf": (int,), "reached": _STR, "rank": _OPT_INT,
    "cause": _STR, "confidence": _OPT_NUM, "summary": _STR, "evidence": (list,),
    "fixes": (list,), "inputs": (list,), "scalars": (dict,), "details": (dict,), "trials": (list,),
}
_INPUT: dict[str, tuple[type, ...]] = {
    "name": (str,), "dtype": (str,), "shape": (list,), "numel": (int,), "nan": (int,),
    "posinf": (int,), "neginf": (int,), "zeros": (int,), "negatives": (int,), "min": _OPT_NUM,
    "max": _OPT_NUM, "absmax": _OPT_NUM, "smallest_abs_nonzero": _OPT_NUM,
}
_RECOVERY: dict[str, tuple[type, ...]] = {
    "step": _OPT_INT, "action": _STR, "description": _STR, "reason": _STR, "cause": _STR,
    "restored_step": _OPT_INT, "steps_lost": _OPT_INT, "lr_scale": _OPT_NUM, "clip_norm": _OPT_NUM,
    "verified": (bool, type(None)), "trials": (list,),
}
_RECORD: dict[str, tuple[type, ...]] = {
    "step": (int,), "loss": _VALUE, "grad_norm": _VALUE, "param_norm": _VALUE, "lr": _VALUE,
    "update_norm": _VALUE, "finite": (bool, type(None)), "skipped": (bool, type(None)),
    "event": _STR, "layer_grad_norms": (dict, type(None)),
}


def _kind(x: Any) -> str:
    return {dict: "JSON object", list: "JSON list", str: "string", bool: "boolean",
            type(None): "null"}.get(type(x), "number" if isinstance(x, _NUM) else type(x).__name__)


def _fields(where: str, d: Any, spec: dict[str, tuple[type, ...]]) -> list[str]:
    if not isinstance(d, dict):
        return [f"{where} should be a JSON object, not a {_kind(d)}"]
    out = []
    for key, types in spec.items():
        if key in d and not isinstance(d[key], types):
            out.append(f"{where}.{key} should be {' or '.join(_kind_of(t) for t in types)}, "
                       f"not {_kind(d[key])} {json.dumps(d[key])[:40]}")
    return out


def _kind_of(t: type) -> str:
    return {int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", bool: "true/false", type(None): "null"}.get(t, t.__name__)


def check_document(doc: dict[str, Any]) -> list[str]:
    """What is wrong with a run log document, field by field (empty: nothing)."""
    problems = _fields("run log", doc, _TOP)
    if problems:
        return problems
    for i, ev in enumerate(doc.get("events", [])):
        problems += _fields(f"events[{i}]", ev, _EVENT)
        if isinstance(ev, dict) and isinstance(ev.get("inputs"), list):
            for j, s in enumerate(ev["inputs"]):
                problems += _fields(f"events[{i}].inputs[{j}]", s, _INPUT)
    for i, rec in enumerate(doc.get("recoveries", [])):
        problems += _fields(f"recoveries[{i}]", rec, _RECOVERY)
    for i, rec in enumerate(doc.get("history", [])):
        problems += _fields(f"history[{i}]", rec, _RECORD)
        if len(problems) > 20:
            break
    return problems
