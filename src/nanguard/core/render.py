"""Turn a finding (and its diagnosis) into text a person can act on.

Two renderings of the same content: :func:`format_finding` gives plain text (exceptions, logs,
non-terminal output); :func:`finding_panel` gives a rich panel for terminals.
"""

from __future__ import annotations

import math
import textwrap
from typing import TYPE_CHECKING, Any

from .ops import canonical_op

if TYPE_CHECKING:
    from rich.console import RenderableType

    from .diagnosis import Diagnosis
    from .finding import Finding

__all__ = ["finding_panel", "format_finding", "headline", "recovery_summary"]

_PHASE_WORDS = {
    "data": "in the input data",
    "forward": "in the forward pass",
    "backward": "in the backward pass",
    "optimizer": "in the optimizer step",
}


def headline(f: Finding, first: bool = True) -> str:
    """``the first non-finite value was made in the forward pass at step 3``; a later event of
    the same run (``first=False``) reads ``a non-finite value was made ... at step 12``."""
    step = f" at step {f.step}" if f.step is not None else ""
    if f.details.get("before_training"):
        run = f.details.get("run")
        step = (" before any training step (no backward() or optimizer step had run)"
                + (f", in {run}" if run else ""))
    rank = f" on rank {f.rank}" if f.rank is not None else ""
    what = "the first non-finite value" if first else "a non-finite value"
    return f"{what} was made {_PHASE_WORDS.get(f.phase, f.phase)}{step}{rank}"


def _rows(f: Finding) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    if f.phase == "data":
        rows.append(("input", f"{f.details.get('input_name', 'batch')}: {f.what}"))
    elif f.op == "parameter":
        rows.append(("tensor", ", ".join(f.details.get("parameters", [])) or (f.module or "?")))
    else:
        rows.append(("op", f"{f.op}  → {f.what}"))
    if f.grad_fn:
        fn = f.details.get("custom_function")
        rows.append(("autograd", f"{f.grad_fn} (the hand-written backward of your autograd.Function "
                                 f"`{fn}`, line below)" if fn else f"{f.grad_fn} (backward of the forward op below)"))
    if f.phase == "data" and f.details.get("entered"):
        rows.append(("entered", f"{f.details['entered']}: the first module that received it"))
    else:
        rows.append(("module", f.where))
    if f.source:
        code = f"    {f.source_code.strip()}" if f.source_code else ""
        rows.append(("source", f"{f.source}{code}"))
    for i, s in enumerate(f.inputs[:4]):
        rows.append(("inputs" if i == 0 else "", s.describe()))
    if f.scalars:
        rows.append(("args", ", ".join(f"{k}={v}" for k, v in f.scalars.items())))
    if f.reached:
        rows.append(("reached", f"the {f.reached}"))
    relu = f.details.get("relu_grad")
    if relu:
        rows.append(("ReluGrad", relu))
    note = f.details.get("note")
    if note:
        rows.append(("note", note))
    if f.details.get("checked"):  # a forward-only program, checked op by op from a point on
        rows.append(("checked", f.details["checked"]))
    return rows


def format_finding(f: Finding, d: Diagnosis | None = None, width: int = 100,
                   first: bool = True) -> str:
    """Plain-text rendering: headline, a table of where, then cause, evidence and fixes."""
    lines = [f"nanguard: {headline(f, first)}.", ""]
    for key, val in _rows(f):
        top, *rest = val.splitlines() or [""]
        lines.append(f"  {key:<9} {top}")
        lines.extend(f"  {'':<9} {r}" for r in rest)
    if d is not None:
        lines += ["", f"cause: {d.cause.value} (confidence {d.confidence:.2f}): {d.summary}"]
        for e in d.evidence:
            lines.extend(
                textwrap.wrap(e, width=width, initial_indent="  - ", subsequent_indent="    ")
            )
        if d.fixes:
            lines += ["", "what to try:"]
            for i, fix in enumerate(d.fixes, 1):
                top, *rest = fix.splitlines()
                lines.append(f"  {i}. {top}")
                lines.extend(f"     {r}" for r in rest)
        lines.extend(_tried(d))
    return "\n".join(lines)


def _tried(d: Diagnosis) -> list[str]:
    """The fixes tried on the failing step (``Diagnosis.trials``), one line each."""
    if not d.trials:
        return []
    out = ["", f"tried on the failing step (from the snapshot of step {d.trials[0].get('from_step')}):"]
    for t in d.trials:
        losses = " → ".join(v if isinstance(v, str) else f"{v:.4g}" for v in t.get("losses", []))
        verdict = _verdict(t)
        out.append(f"  - {t.get('fix')}: loss {losses} ({verdict})")
    return out


def finding_panel(f: Finding, d: Diagnosis | None = None, first: bool = True) -> RenderableType:
    """A rich panel with the same content as :func:`format_finding`; on a narrow terminal every
    line wraps (the fixes' code too), nothing is cut off."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.syntax import Syntax
    from rich.table import Table
    from rich.text import Text

    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for key, val in _rows(f):
        table.add_row(key, Text(val))
    parts: list[RenderableType] = [Text(headline(f, first), style="bold"), Text(""), table]
    if d is not None:
        parts += [
            Text(""),
            Text.assemble(
                ("cause ", "bold"),
                (d.cause.value, "bold red"),
                (f"  (confidence {d.confidence:.2f})  ", "dim"),
                d.summary,
            ),
        ]
        for e in d.evidence:
            parts.append(Text(f"  • {e}"))
        if d.fixes:
            parts += [Text(""), Text("what to try", style="bold")]
            for i, fix in enumerate(d.fixes, 1):
                parts.append(Text(f"{i}.", style="bold"))
                parts.append(Syntax(fix, "python", theme="ansi_dark", background_color="default",
                                    word_wrap=True))
        parts.extend(Text(line) for line in _tried(d))
    title = f"nanguard · {f.phase} · {canonical_op(f.op) or f.phase}"
    return Panel(Group(*parts), title=title, border_style="red", expand=False)


def event_line(rec: dict[str, Any], n: int) -> str | None:
    """The line printed as a policy acts on a non-finite step (``rec``: its run-log entry, the
    ``n``-th of the run): every one of the first 10, then at 20, 50, 100, 200, 500, … a count —
    a run that drops thousands of batches says so as it goes, without a line for each."""
    what = f"{rec.get('cause') or '?'} → {rec.get('description') or rec.get('action')}"
    lost = int(rec.get("steps_lost") or 0)
    if lost:
        what += f", {lost} step{'s' if lost != 1 else ''} lost"
    if rec.get("verified") is True:
        what += " (verified on the failing step)"
    elif rec.get("verified") is None and rec.get("action") == "rollback" and "escalation" not in rec:
        what += " (untried: judged by the outcome)"
    if n <= 10:
        return f"nanguard: step {rec.get('step')}: {what}"
    k = 10 ** int(math.log10(n))
    if n in (2 * k, 5 * k, 10 * k) or n == k:
        return f"nanguard: {n} non-finite steps so far; the last, step {rec.get('step')}: {what}"
    return None


def recovery_summary(
    steps: int,
    recoveries: list[dict[str, Any]],
    n_events: int,
    policy: str,
    outcome: dict[str, Any] | None = None,
    max_lines: int = 8,
    header: str | None = None,
) -> str | None:
    """What a run that finished under ``skip`` or ``recover`` did about its non-finite steps, in
    a few lines (runs of the same action are folded: ``steps 0–47: nonfinite-input → drop batch
    (×36)``); ``None`` when there was nothing. Printed at the end of ``nanguard run``: a learning
    rate cut by 100 or a third of the data dropped must not go unnoticed. ``header`` replaces
    the first line (a run that stopped: ``nanguard gave up at step 12 ...``)."""
    if not recoveries and not n_events:
        return None
    groups: list[list[dict[str, Any]]] = []
    for r in recoveries:
        key = (r.get("cause"), r.get("description"))
        if groups and (groups[-1][0].get("cause"), groups[-1][0].get("description")) == key:
            groups[-1].append(r)
        else:
            groups.append([r])
    n_bad = len(recoveries) or n_events
    lines = [header or f"nanguard: the run finished after {steps:,} steps; it met non-finite "
             f"values at {n_bad} step{'s' if n_bad != 1 else ''} (policy {policy}):"]
    for g in groups[:max_lines]:
        first, last = g[0].get("step"), g[-1].get("step")
        where = f"step {first}" if len(g) == 1 else f"steps {first}–{last}"
        what = f"{g[0].get('cause') or '?'} → {g[0].get('description') or g[0].get('action')}"
        if len(g) > 1:
            what += f" (×{len(g)})"
        lost = sum(int(r.get("steps_lost") or 0) for r in g)
        if lost:
            what += f", {lost} step{'s' if lost != 1 else ''} lost"
        lines.append(f"  {where}: {what}")
    if len(groups) > max_lines:
        lines.append(f"  … and {len(groups) - max_lines} more")
    rollbacks = sum(1 for r in recoveries if r.get("action") == "rollback")
    dropped = sum(1 for r in recoveries if r.get("action") == "drop_batch")
    skipped = sum(1 for r in recoveries if r.get("action") == "skip") or (
        n_events if not recoveries else 0)
    totals = [f"{rollbacks} rollback{'s' if rollbacks != 1 else ''}",
              f"{dropped} batch{'es' if dropped != 1 else ''} dropped", f"{skipped} skipped"]
    scale = next((r["lr_scale"] for r in reversed(recoveries) if r.get("lr_scale") is not None), None)
    changes = (outcome or {}).get("lr_changes") or []
    if changes:  # the back-off grew back since the last action: the factor in force now
        scale = (outcome or {}).get("lr_scale", scale)
    if scale is not None and scale != 1:
        totals.append(f"the learning rate is now ×{scale:.3g} the script's")
    clip = next((r["clip_norm"] for r in reversed(recoveries) if r.get("clip_norm") is not None), None)
    if clip is not None:
        totals.append(f"gradients clipped at {clip:.3g}")
    lines.append("  in all: " + ", ".join(totals))
    if changes:
        raised = sum(1 for c in changes if c.get("lr_scale", 0) > c.get("was", 0))
        relapsed = sum(1 for c in changes if str(c.get("why", "")).startswith("relapsed"))
        undone = len(changes) - raised - relapsed
        again = (f", {relapsed} undone later when the loss climbed back (relapsed)" if relapsed else "")
        lines.append(f"  the back-off grew back ×2 {raised} time{'s' if raised != 1 else ''} after healthy "
                     f"stretches, {undone} of the raises undone on probation{again} (the run log's "
                     "outcome.lr_changes)")
    lines.extend(trial_lines(recoveries))
    lines.extend(outcome_lines(outcome))
    return "\n".join(lines)


def trial_lines(recoveries: list[dict[str, Any]], max_lines: int = 4) -> list[str]:
    """The fixes tried on failing steps before one was applied, with their losses."""
    out: list[str] = []
    for r in recoveries:
        trials = r.get("trials") or []
        if not trials:
            if r.get("action") == "rollback" and "verified" in r and r["verified"] is None:
                out.append(f"  step {r.get('step')}: {r.get('description')} applied untried "
                           "(the step could not be re-run): judged by the outcome below")
            continue
        for t in trials:
            losses = " → ".join(f"{v:.4g}" if isinstance(v, (int, float)) else str(v) for v in t.get("losses", []))
            verdict = _verdict(t)
            out.append(f"  step {r.get('step')}: tried {t.get('fix')} from step {t.get('from_step')}: "
                       f"loss {losses} ({verdict})")
    if len(out) > max_lines:
        out = [*out[:max_lines], f"  … and {len(out) - max_lines} more tries (the run log lists them)"]
    return out


def outcome_lines(outcome: dict[str, Any] | None) -> list[str]:
    """The judged outcome: did the loss come back to the run's healthy level?"""
    if not outcome:
        return []
    status = outcome.get("status")
    head = {"recovered": "outcome: recovered", "not-recovered": "outcome: NOT recovered",
            "unjudged": "outcome: not judged"}.get(str(status), f"outcome: {status}")
    return [f"  {head} — {outcome.get('reason') or ''}".rstrip(" —")]


def _verdict(t: dict[str, Any]) -> str:
    if t.get("verified"):
        return "verified"
    if t.get("grads_finite") is False:
        return "gradients not finite"
    return "not finite" if not t.get("finite") else "loss did not go down"
