"""Run logs under ``torchrun``: every rank gets the same ``--json PATH``; each keeps its own
(rank 0 at ``PATH``, rank *r* at ``STEM.rank{r}.EXT``), and :func:`merge_ranks` builds the one
view ``nanguard report`` renders, saying which rank saw what."""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from .runlog import RunLog

__all__ = ["group_rank", "merge_ranks", "rank_from_env", "rank_path", "rank_prefix", "say"]


def rank_from_env(env: dict[str, str] | None = None) -> tuple[int, int] | None:
    """``(rank, world_size)`` under ``torchrun`` (its ``RANK``/``WORLD_SIZE``), else ``None``."""
    env = dict(os.environ) if env is None else env
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    return (rank, world) if world > 1 and 0 <= rank < world else None


def group_rank() -> tuple[int, int] | None:
    """``(rank, world_size)`` of a process group a framework started without torchrun's variables
    (Lightning's own launcher removes ``WORLD_SIZE``): read from ``torch.distributed`` when the
    script has loaded it — never imported here."""
    d = sys.modules.get("torch.distributed")
    try:
        if d is not None and d.is_available() and d.is_initialized() and d.get_world_size() > 1:
            return int(d.get_rank()), int(d.get_world_size())
    except (AttributeError, RuntimeError, ValueError):
        return None
    return None


def rank_prefix(env: dict[str, str] | None = None) -> str:
    """``"[rank r] "`` under ``torchrun`` (or another launcher's process group) with more than one
    rank, else ``""``: what every line a rank prints on its own begins with, so that the ranks'
    lines can be told apart."""
    ranked = rank_from_env(env) or (group_rank() if env is None else None)
    return f"[rank {ranked[0]}] " if ranked is not None else ""


def say(line: str, file: TextIO | None = None) -> None:
    """Print one line of ours on stderr (``file``), led by :func:`rank_prefix`, in one write:
    the ranks share the terminal, and a line written in two parts (text, then newline) comes out
    cut by another rank's line."""
    f = sys.stderr if file is None else file
    sys.stdout.flush()
    f.write(rank_prefix() + line + "\n")
    f.flush()


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
_SEVERITY = {"ok": 0, "recovered": 1, "unjudged": 2, "not-recovered": 3, "interrupted": 4, "error": 5,
             "nonfinite": 6}


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
