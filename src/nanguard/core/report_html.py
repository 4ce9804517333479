"""A self-contained HTML report of one run (``nanguard run --report``, ``nanguard report``).

Written once, at the end of a run (or later, from the JSON run log), whatever the run's status:
healthy, recovered, stopped on a non-finite value, crashed or interrupted. The page holds

* the finding and its diagnosis at the top: origin op, module, source line, phase, step, cause,
  evidence, and the fixes as code with a copy button;
* plots over steps — loss, global gradient norm, per-layer gradient norms (largest layers),
  learning rate, update/weight ratio — drawn by matplotlib (Agg, no pyplot) as inline SVG, with
  the first non-finite step and every skip and rollback marked;
* the recoveries, further events, notes.

It opens offline: no ``<script src>``, no external fonts, styles or images; the only script is a
few inline lines for the copy buttons. Every string that comes from the run (module names, source
code, messages) is escaped. Framework-free: matplotlib is imported when a report with plots is
written (the ``report`` extra), never by ``import nanguard``. A run with no healthy step (it
failed at its first) and an interrupted ``nanguard run`` (drawing takes seconds) get a sentence
in the place of the plots instead.
"""

from __future__ import annotations

import html
import io
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .early import projection
from .finding import Finding
from .outfile import write_atomic
from .render import headline

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from .runlog import RunLog

__all__ = ["needs_plots", "render_report", "write_report"]

#: per-layer gradient norms shown: the largest this many tensors
TOP_LAYERS = 8
_HEALTHY_RATIO = 1e-3

_C_FAIL = "#d62728"
_C_SKIP = "#ff7f0e"
_C_WARN = "#b8860b"
_C_ROLLBACK = "#7b4fc9"
_C_LINE = "#1f77b4"


# ----------------------------------------------------------------------------------------------
# the run's numbers


def _num(v: Any) -> float | None:
    """A history value as a float: ``None`` when absent, NaN/±Inf for ``"nan"``/``"inf"``."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


@dataclass
class _Marks:
    first_bad: int | None = None
    skips: list[tuple[int, str]] = field(default_factory=list)  # (step, kind)
    rollbacks: list[tuple[int, int | None]] = field(default_factory=list)  # (step, restored to)
    warnings: list[tuple[int, str]] = field(default_factory=list)  # (step, kind): early warnings


@dataclass
class _Series:
    steps: list[int]
    values: dict[str, list[float | None]]
    layers: dict[str, list[float | None]]
    layer_steps: list[int]
    layer_total: int


def _series(history: Sequence[Mapping[str, Any]]) -> _Series:
    steps = [int(r.get("step", i)) for i, r in enumerate(history)]
    vals: dict[str, list[float | None]] = {k: [] for k in ("loss", "grad_norm", "lr", "ratio")}
    for r in history:
        loss, g, p, lr = (_num(r.get(k)) for k in ("loss", "grad_norm", "param_norm", "lr"))
        vals["loss"].append(loss)
        vals["grad_norm"].append(g)
        vals["lr"].append(lr)
        upd = _num(r.get("update_norm"))
        if upd is None and lr is not None and g is not None:
            upd = lr * g  # exact for plain SGD; the adapter's estimate is preferred when logged
        ratio = None
        if upd is not None and p and math.isfinite(p) and math.isfinite(upd):
            ratio = upd / p
        vals["ratio"].append(ratio)
    layer_rows = [(s, r["layer_grad_norms"]) for s, r in zip(steps, history) if r.get("layer_grad_norms")]
    names: list[str] = []
    for _, d in layer_rows:
        names.extend(k for k in d if k not in names)
    peak = {}
    for n in names:
        fin = [x for _, d in layer_rows if (x := _num(d.get(n))) is not None and math.isfinite(x)]
        peak[n] = max(fin) if fin else -1.0
    top = sorted(names, key=lambda n: -peak[n])[:TOP_LAYERS]
    layers = {n: [_num(d.get(n)) for _, d in layer_rows] for n in top}
    return _Series(steps, vals, layers, [s for s, _ in layer_rows], len(names))


def _marks(doc: Mapping[str, Any]) -> _Marks:
    m = _Marks()
    bad = [int(r["step"]) for r in doc.get("history", []) if r.get("finite") is False]
    ev = [int(e["step"]) for e in doc.get("events", []) if e.get("step") is not None]
    cands = bad + ev
    m.first_bad = min(cands) if cands else None
    m.warnings = [(int(w["step"]), str(w.get("kind"))) for w in doc.get("warnings") or []
                  if isinstance(w, Mapping) and isinstance(w.get("step"), int)]
    seen: set[int] = set()
    for rec in doc.get("recoveries", []):
        step = rec.get("step")
        if step is None:
            continue
        kind = str(rec.get("action", "skip"))
        if kind == "rollback":
            restored = rec.get("restored_step")
            m.rollbacks.append((int(step), int(restored) if isinstance(restored, int) else None))
        elif kind in ("skip", "drop_batch", "give_up"):
            m.skips.append((int(step), kind))
        seen.add(int(step))
    for r in doc.get("history", []):
        step = int(r.get("step", -1))
        if step in seen:
            continue
        if r.get("skipped") or r.get("event") in ("skip", "drop_batch", "scaler-skip"):
            m.skips.append((step, str(r.get("event") or "skip")))
    return m


# ----------------------------------------------------------------------------------------------
# plots (matplotlib, no pyplot: nothing global changes in the caller's process)


def _mpl_label(s: str) -> str:
    """A run string as literal matplotlib text: ``$`` would start mathtext, so it is escaped
    (``\\$``). Backslashes stay as they are: outside mathtext matplotlib draws them literally
    and turns only ``\\$`` back into ``$`` (``$\\alpha`` is drawn as ``$\\alpha``)."""
    return s.replace("$", r"\$")


def _mark_axes(ax: Axes, marks: _Marks, lo: float, hi: float) -> None:
    """Vertical marks for the first non-finite step, rollbacks and skips within ``[lo, hi]``."""
    def inside(x: float) -> bool:
        return lo <= x <= hi

    if marks.first_bad is not None and inside(marks.first_bad):
        ax.axvline(marks.first_bad, color=_C_FAIL, lw=1.6, zorder=1,
                   label=f"first non-finite (step {marks.first_bad})")
    first = True
    for step, restored in marks.rollbacks:
        if not inside(step):
            continue
        if restored is not None and restored < step:
            ax.axvspan(max(restored, lo), step, color=_C_ROLLBACK, alpha=0.12, lw=0, zorder=0)
        label = "rollback" + (f" (to step {restored})" if restored is not None else "")
        ax.axvline(step, color=_C_ROLLBACK, ls="--", lw=1.3, zorder=1, label=label if first else "_")
        first = False
    for i, (step, kind) in enumerate(marks.warnings):
        if inside(step):
            ax.axvline(step, color=_C_WARN, ls="-.", lw=1.2, zorder=1,
                       label=f"early warning: {kind} (step {step})" if i < 2 else "_")
    first = True
    for step, kind in marks.skips:
        if not inside(step):
            continue
        label = "dropped batch" if kind == "drop_batch" else "skipped step"
        ax.axvline(step, color=_C_SKIP, ls=":", lw=1.3, zorder=1, label=label if first else "_")
        first = False


def _use_log(values: Sequence[float], span: float = 1e3) -> bool:
    pos = [v for v in values if v > 0]
    return len(pos) == len(values) and len(pos) > 1 and max(pos) / min(pos) > span


Lines = Mapping[str, tuple[Sequence[int], Sequence[float | None]]]


def _draw(
    ax: Axes,
    lines: Lines,
    marks: _Marks,
    xlim: tuple[float, float],
    *,
    log: bool | None,
    log_span: float,
    drawstyle: str,
    reference: tuple[float, str] | None,
) -> list[tuple[Any, str]]:
    """Draw ``lines`` and the marks on ``ax``; returns the lines' legend entries."""
    handles: list[tuple[Any, str]] = []
    from matplotlib.ticker import MaxNLocator

    lo, hi = xlim
    finite_all: list[float] = []
    bad_pts: list[int] = []
    n_visible = max(
        (sum(1 for s in steps if lo <= s <= hi) for steps, _ in lines.values()), default=0
    )
    for label, (steps, vals) in lines.items():
        pts = [(s, v) for s, v in zip(steps, vals) if lo - 1 <= s <= hi + 1]
        # a NaN breaks the line: no segment is drawn across a missing or non-finite value
        xs = [s for s, _ in pts]
        ys = [v if v is not None and math.isfinite(v) else math.nan for _, v in pts]
        bad_pts += [s for s, v in pts if v is not None and not math.isfinite(v)]
        finite_all += [v for v in ys if math.isfinite(v)]
        color = _C_LINE if len(lines) == 1 else None
        (handle,) = ax.plot(xs, ys, lw=1.4, color=color, drawstyle=drawstyle,
                            marker=None if n_visible > 40 else "o", ms=3, label="_line")
        # legend entries of lines are passed explicitly: a name starting with "_" stays shown
        handles.append((handle, _mpl_label(label)))
    if log is None:
        log = _use_log(finite_all, log_span)
    if log and finite_all and min(finite_all) > 0:
        ax.set_yscale("log")
    if reference is not None:
        ax.axhline(reference[0], color="#999999", ls="--", lw=0.9, label=reference[1])
    _mark_axes(ax, marks, lo, hi)
    if bad_pts:
        # a non-finite value has no height: mark it at the top of the axes
        ax.plot(bad_pts, [0.95] * len(bad_pts), ls="none", marker="X", ms=8, color=_C_FAIL,
                transform=ax.get_xaxis_transform(), clip_on=False, label="NaN/Inf value")
    pad = max(0.5, (hi - lo) * 0.02)
    ax.set_xlim(lo - pad, hi + pad)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_xlabel("step")
    return handles


#: matplotlib settings of every plot (plus a distinct ``svg.hashsalt`` each)
_RC: dict[str, Any] = {
    "svg.fonttype": "none",  # text stays text: searchable, and drawn in the page's font
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e6e6e6",
    "grid.linewidth": 0.6,
    "axes.edgecolor": "#888888",
    "axes.titlesize": 9,
    "axes.titlecolor": "#5b6475",
    "legend.fontsize": 8,
    "legend.frameon": True,
    "legend.framealpha": 0.85,
    "legend.edgecolor": "#ffffff",
}


def _plot_svg(
    key: str,
    lines: Lines,
    marks: _Marks,
    all_steps: Sequence[int],
    ylabel: str,
    *,
    log: bool | None = None,
    log_span: float = 1e3,
    drawstyle: str = "default",
    reference: tuple[float, str] | None = None,
    legend_outside: bool = False,
    wide: bool = False,
    own_range: bool = False,
) -> str:
    """One figure as an SVG string. ``wide``: the full width of the page, with a zoom on the
    first non-finite step when the run is long; ``own_range``: the x range of the lines only
    (per-layer norms, kept for the last steps)."""
    import matplotlib
    from matplotlib.figure import Figure

    # distinct element ids for each inline SVG
    rc: Any = {**_RC, "svg.hashsalt": f"nanguard-{key}"}
    if own_range:
        xs = [s for steps, _ in lines.values() for s in steps]
    else:
        xs = list(all_steps) + ([marks.first_bad] if marks.first_bad is not None else [])
    lo, hi = (float(min(xs)), float(max(xs))) if xs else (0.0, 1.0)
    opts: dict[str, Any] = {"log": log, "log_span": log_span, "drawstyle": drawstyle,
                            "reference": reference}
    with matplotlib.rc_context(rc):
        zoom = wide and marks.first_bad is not None and hi - lo > 60
        if wide:
            fig = Figure(figsize=(12.8, 3.1), layout="constrained")
        else:
            fig = Figure(figsize=(6.4, 3.0), layout="constrained")
        if zoom:
            ax, zax = fig.subplots(1, 2, width_ratios=[2.2, 1])
        else:
            ax, zax = fig.add_subplot(), None
        line_entries = _draw(ax, lines, marks, (lo, hi), **opts)
        ax.set_ylabel(ylabel)
        if zax is not None and marks.first_bad is not None:
            z0 = max(lo, marks.first_bad - 12)
            z1 = min(hi, marks.first_bad + 12)
            _draw(zax, lines, marks, (z0, z1), **opts)
            zax.set_title(f"steps {z0:g}–{z1:g}, around the first non-finite value", loc="left")
            ax.set_title("the whole run", loc="left")
        handles, labels = ax.get_legend_handles_labels()
        if zax is not None:
            zh, zl = zax.get_legend_handles_labels()
            handles, labels = handles + zh, labels + zl
        uniq: dict[str, Any] = {}
        if len(lines) > 1:
            uniq.update((lab, h) for h, lab in line_entries)
        for h, lab in zip(handles, labels):
            if lab and not lab.startswith("_") and lab not in uniq:
                uniq[lab] = h
        if uniq:
            if legend_outside:
                fig.legend(list(uniq.values()), list(uniq.keys()), loc="outside right upper",
                           frameon=False)
            else:
                (zax or ax).legend(list(uniq.values()), list(uniq.keys()), loc="best")
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def _healthy(row: Mapping[str, Any]) -> bool:
    """Whether a history row is a point worth plotting: a step not marked non-finite with at
    least one finite loss, gradient norm or learning rate."""
    if row.get("finite") is False:
        return False
    return any((v := _num(row.get(k))) is not None and math.isfinite(v)
               for k in ("loss", "grad_norm", "lr"))


def _no_plots(doc: Mapping[str, Any]) -> str | None:
    """Why the report has no plots — said in their place — or ``None`` when the history has a
    healthy step to draw. A run that failed at its first step has only a non-finite row (or
    none): its plots would be empty axes with a ✕."""
    hist = doc.get("history") or []
    if any(_healthy(r) for r in hist):
        return None
    first_bad = _marks(doc).first_bad
    if first_bad is not None and doc.get("status") == "nonfinite":
        return (f"No plots: the run stopped at step {first_bad}, before any healthy step was "
                "recorded.")
    if not hist:
        return "No steps were recorded."
    if first_bad is not None:
        return (f"No plots: none of the {len(hist)} recorded steps was healthy (the first "
                f"non-finite value: step {first_bad}).")
    return f"No plots: the {len(hist)} recorded steps hold no loss, gradient norm or learning rate."


def _plots(doc: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """``(id, title, caption, svg)`` for each plot the history allows (called only when
    :func:`_no_plots` found a healthy step)."""
    hist = doc.get("history") or []
    s = _series(hist)
    m = _marks(doc)
    out: list[tuple[str, str, str, str]] = []

    def one(key: str, title: str, caption: str, ylabel: str, **kw: Any) -> None:
        vals = s.values[key]
        if all(v is None for v in vals):
            return
        svg = _plot_svg(key, {title: (s.steps, vals)}, m, s.steps, ylabel, **kw)
        out.append((f"plot-{key.replace('_', '-')}", title, caption, svg))

    one("loss", "Loss", "The loss of each step, read before the update.", "loss", wide=True)
    one("grad_norm", "Global gradient norm",
        "‖g‖₂ over all gradients, read before the update (and before any clipping).", "‖g‖₂")
    if s.layers:
        shown = len(s.layers)
        cap = (f"The {shown} largest of {s.layer_total} gradient tensors"
               if s.layer_total > shown else f"All {shown} gradient tensors")
        cap += f", over the last {len(s.layer_steps)} recorded steps (per-layer norms are kept " \
               "for the most recent steps only)."
        svg = _plot_svg("layers", {k: (s.layer_steps, v) for k, v in s.layers.items()}, m,
                        s.steps, "‖g‖₂", legend_outside=True, own_range=True, log_span=1e2)
        out.append(("plot-layer-grad-norms", "Per-layer gradient norms", cap, svg))
    one("lr", "Learning rate", "The learning rate of the first parameter group, as applied "
        "(with nanguard's back-off).", "lr", drawstyle="steps-post", log_span=10.0)
    one("ratio", "Update/weight ratio",
        "‖Δw‖ / ‖w‖ per step (estimated: lr·‖g‖ for SGD-like optimizers). Healthy training stays "
        "near 1e-3; near 1 the weights are replaced at every step.", "‖Δw‖/‖w‖",
        log=True, reference=(_HEALTHY_RATIO, "healthy ≈ 1e-3"))
    return out


# ----------------------------------------------------------------------------------------------
# HTML


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


_STATUS_WORDS = {
    "ok": ("healthy", "ok"),
    "recovered": ("recovered", "warn"),
    "unjudged": ("finished, outcome not judged", "warn"),
    "not-recovered": ("finished, not recovered", "bad"),
    "nonfinite": ("stopped on a non-finite value", "bad"),
    "error": ("crashed", "bad"),
    "interrupted": ("interrupted", "warn"),
}


def _summary(doc: Mapping[str, Any]) -> str:
    status = doc.get("status")
    steps = doc.get("steps") or 0
    recs = doc.get("recoveries") or []
    rollbacks = sum(1 for r in recs if r.get("action") == "rollback")
    skips = sum(1 for r in recs if r.get("action") in ("skip", "drop_batch"))
    events = doc.get("events") or []
    if status == "ok" and not events:
        return f"{steps} steps, no non-finite value."
    if status == "nonfinite" and events:
        return f"Stopped at step {events[0].get('step')}: {headline(Finding.from_dict(events[0]))}."
    if status in ("recovered", "unjudged", "not-recovered"):
        out = doc.get("outcome") or {}
        verdict = f" Outcome: {out.get('status')} — {out.get('reason')}." if out else ""
        return (f"Met non-finite values {len(events)} time(s) and finished {steps} steps: "
                f"{rollbacks} rollback(s), {skips} skipped or dropped step(s).{verdict}")
    if status == "error":
        return f"The script raised an error after {steps} steps."
    if status == "interrupted":
        return f"Interrupted after {steps} steps."
    return f"{steps} steps."


def _finding_html(ev: Mapping[str, Any], idx: int) -> str:
    f = Finding.from_dict(dict(ev))
    rows: list[tuple[str, str]] = []
    if f.phase == "data":
        rows.append(("input", _e(f"{f.details.get('input_name', 'batch')}: {f.what}")))
    elif f.op == "parameter":
        rows.append(("tensor", _e(", ".join(f.details.get("parameters", [])) or (f.module or "?"))))
    else:
        rows.append(("op", f"<code>{_e(f.op or 'unknown')}</code> → {_e(f.what)}"))
    if f.grad_fn:
        rows.append(("autograd", f"<code>{_e(f.grad_fn)}</code> (backward of the forward op below)"))
    rows.append(("module", f"<code>{_e(f.where)}</code>"))
    if f.source:
        code = (f"<pre class='src'><code>{_e(f.source_code.strip())}</code></pre>"
                if f.source_code else "")
        rows.append(("source", f"<code>{_e(f.source)}</code>{code}"))
    rows.append(("phase", _e(f.phase)))
    rows.append(("step", _e(f.step if f.step is not None else "?")))
    if f.inputs:
        rows.append(("inputs", "<br>".join(_e(s.describe()) for s in f.inputs[:6])))
    if f.scalars:
        rows.append(("args", _e(", ".join(f"{k}={v}" for k, v in f.scalars.items()))))
    if f.reached:
        rows.append(("reached", _e(f"the {f.reached}")))
    samples = f.details.get("samples")
    if samples:
        rows.append(("samples", _e(", ".join(str(s.get("index", s)) if isinstance(s, dict) else
                                             str(s) for s in samples[:20]))))
    for key, label in (("relu_grad", "ReluGrad"), ("note", "note"), ("seen_on_rank", "rank")):
        if f.details.get(key) is not None:
            rows.append((label, _e(f.details[key])))
    table = "\n".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    parts = [f"<p class='headline'>{_e(headline(f, first=idx == 0))}</p>",
             f"<table class='where'>{table}</table>"]
    cause = ev.get("cause")
    if cause:
        conf = ev.get("confidence")
        conf_s = f"confidence {float(conf):.2f}" if isinstance(conf, (int, float)) else ""
        parts.append(
            f"<div class='cause'><span class='cause-id'>{_e(cause)}</span>"
            f"<span class='conf'>{_e(conf_s)}</span><div class='summary'>{_e(ev.get('summary'))}</div>"
        )
        evidence = ev.get("evidence") or []
        if evidence:
            parts.append("<ul class='evidence'>" + "".join(f"<li>{_e(x)}</li>" for x in evidence)
                         + "</ul>")
        parts.append("</div>")
        fixes = ev.get("fixes") or []
        if fixes:
            items = "".join(
                f"<li><div class='fix'><pre><code id='fix-{idx}-{i}'>{_e(fix)}</code></pre>"
                f"<button class='copy' type='button' data-target='fix-{idx}-{i}'>copy</button>"
                "</div></li>"
                for i, fix in enumerate(fixes)
            )
            parts.append(f"<h3>What to try</h3><ol class='fixes'>{items}</ol>")
        trials = ev.get("trials") or []
        if trials:
            items_t = "".join(
                f"<li>{_e(t.get('fix'))}: loss {_e(' → '.join(str(v) if isinstance(v, str) else f'{v:.4g}' for v in t.get('losses', [])))}"
                f" — <b>{'verified' if t.get('verified') else 'not verified'}</b></li>"
                for t in trials)
            parts.append(f"<h3>Tried on the failing step (from step {_e(trials[0].get('from_step'))})</h3>"
                         f"<ul class='trials'>{items_t}</ul>")
    return "\n".join(parts)


def _warnings_html(warnings: Sequence[Mapping[str, Any]]) -> str:
    """The early warnings, each with its step, evidence and projected overflow step."""
    if not warnings:
        return ""
    items = []
    for w in warnings:
        ahead = projection(w.get("kind"), w.get("projected_step"))
        when = f" — {_e(ahead)}" if ahead else ""
        ev = "".join(f"<li>{_e(x)}</li>" for x in w.get("evidence") or [])
        items.append(f"<li><b>step {_e(w.get('step'))}</b> <code>{_e(w.get('kind'))}</code>: "
                     f"{_e(w.get('message'))}{when}<ul>{ev}</ul></li>")
    return ("<section class='card' id='warnings'><h2>Early warnings</h2><ul>"
            + "".join(items) + "</ul></section>")


def _recoveries_html(recs: Sequence[Mapping[str, Any]]) -> str:
    if not recs:
        return ""
    rows = []
    for r in recs:
        restored = r.get("restored_step")
        rows.append(
            "<tr>" + "".join(f"<td>{_e(x)}</td>" for x in (
                r.get("step"), r.get("action"), r.get("description"), r.get("cause") or r.get("reason"),
                "" if restored is None else f"step {restored}",
            )) + "</tr>"
        )
    head = "".join(f"<th>{h}</th>" for h in ("step", "action", "what was done", "cause", "restored"))
    return (f"<section class='card' id='recoveries'><h2>Recoveries</h2><table class='grid'><thead><tr>{head}"
            f"</tr></thead><tbody>{''.join(rows)}</tbody></table></section>")


def _later_events_html(events: Sequence[Mapping[str, Any]]) -> str:
    """Every event after the first, folded: ``step 12: unsafe-op — aten.log.default in fc2``
    (``outside any module`` where it had none)."""
    if len(events) < 2:
        return ""
    items = []
    for i, ev in enumerate(events[1:], 1):
        known = ev.get("module") is not None or (ev.get("details") or {}).get("module_unknown")
        where = Finding.from_dict(dict(ev)).where if known else None  # "not known" is said so
        place = f" in <code>{_e(where)}</code>" if where else " (outside any module)"
        items.append(f"<details class='card'><summary>step {_e(ev.get('step'))}: "
                     f"{_e(ev.get('cause') or 'no diagnosis')} — <code>{_e(ev.get('op'))}</code>"
                     f"{place}</summary>{_finding_html(ev, i)}</details>")
    return f"<section id='events'><h2>All events</h2>{''.join(items)}</section>"


def _dedupe(events: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One entry per distinct event: two guards on one optimizer may report the same step."""
    seen: set[tuple[Any, ...]] = set()
    out = []
    for e in events:
        key = (e.get("step"), e.get("phase"), e.get("op"), e.get("module"), e.get("cause"))
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


_CSS = """
:root{--fg:#1d2330;--muted:#5b6475;--line:#e3e6ec;--bg:#f6f7f9;--bad:#d62728;--warn:#c76a00;
--ok:#1a7f37;--code:#f2f4f7}
*{box-sizing:border-box}
body{margin:0;font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,
sans-serif;color:var(--fg);background:var(--bg)}
main{max-width:1240px;margin:0 auto;padding:24px 28px 40px}
header{display:flex;align-items:baseline;gap:14px;flex-wrap:wrap;margin-bottom:4px}
h1{font-size:22px;margin:0}
h2{font-size:17px;margin:0 0 10px}
h3{font-size:14px;margin:16px 0 6px}
.badge{display:inline-block;padding:2px 10px;border-radius:12px;font-weight:600;font-size:13px;
color:#fff}
.badge.ok{background:var(--ok)}.badge.warn{background:var(--warn)}.badge.bad{background:var(--bad)}
.meta{color:var(--muted);font-size:13px;margin:2px 0 16px}
.meta code{font-size:12.5px}
.card{background:#fff;border:1px solid var(--line);border-radius:10px;padding:18px 22px;
margin:0 0 18px;box-shadow:0 1px 2px rgba(16,24,40,.04)}
.card.finding{border-left:5px solid var(--bad)}
.card.healthy{border-left:5px solid var(--ok)}
.card.recovered{border-left:5px solid var(--warn)}
.headline{font-size:16px;font-weight:600;margin:0 0 10px}
table.where{border-collapse:collapse;width:100%}
table.where th{text-align:left;vertical-align:top;color:var(--muted);font-weight:600;
padding:3px 18px 3px 0;white-space:nowrap;width:1%}
table.where td{padding:3px 0}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace;
font-size:12.5px}
pre{margin:0;white-space:pre-wrap;word-break:break-word}
pre.src{background:var(--code);padding:4px 8px;border-radius:6px;margin-top:4px}
.cause{margin-top:14px;padding:12px 14px;background:#fff5f5;border-radius:8px}
.cause-id{font-weight:700;color:var(--bad);font-family:ui-monospace,Menlo,Consolas,monospace}
.conf{color:var(--muted);margin-left:10px;font-size:12.5px}
.summary{margin-top:2px}
ul.evidence{margin:8px 0 0;padding-left:20px}
ol.fixes{padding-left:22px;margin:0}
ol.fixes li{margin:6px 0}
.fix{display:flex;align-items:flex-start;gap:8px}
.fix pre{flex:1;background:var(--code);padding:6px 10px;border-radius:6px}
button.copy{font:12px system-ui,sans-serif;border:1px solid var(--line);background:#fff;
border-radius:6px;padding:4px 9px;cursor:pointer}
button.copy:hover{background:var(--bg)}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:18px}
.plots figure{margin:0;background:#fff;border:1px solid var(--line);border-radius:10px;
padding:12px 14px}
.plots figure.wide{grid-column:1/-1}
.plots figcaption{color:var(--muted);font-size:12.5px;margin-bottom:4px}
.plots figcaption b{color:var(--fg);font-size:14px;display:block}
.plots svg{width:100%;height:auto;display:block}
.legend-key{color:var(--muted);font-size:12.5px;margin:0 0 10px}
.legend-key span{display:inline-block;width:18px;height:0;margin:0 4px 3px 12px;
vertical-align:middle}
table.grid{border-collapse:collapse;width:100%;font-size:13px}
table.grid th,table.grid td{border-bottom:1px solid var(--line);text-align:left;padding:5px 8px}
details{margin-top:8px}
summary{cursor:pointer;font-weight:600}
footer{color:var(--muted);font-size:12px;margin-top:24px}
"""

_JS = """
document.addEventListener('click', function (ev) {
  var b = ev.target.closest && ev.target.closest('button.copy');
  if (!b) { return; }
  var code = document.getElementById(b.getAttribute('data-target'));
  var text = code ? code.textContent : '';
  function done() { b.textContent = 'copied'; setTimeout(function () { b.textContent = 'copy'; }, 1200); }
  if (navigator.clipboard && navigator.clipboard.writeText) {
    navigator.clipboard.writeText(text).then(done, function () {});
  } else {
    var r = document.createRange(); r.selectNodeContents(code);
    var s = window.getSelection(); s.removeAllRanges(); s.addRange(r);
    try { document.execCommand('copy'); done(); } catch (e) {}
  }
});
"""


def _doc(log: RunLog | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(log, Mapping):
        return dict(log)
    to_dict = getattr(log, "to_dict", None)
    if to_dict is None:
        raise TypeError(f"write_report expects a RunLog or its JSON dict, got {type(log).__name__}")
    d: dict[str, Any] = to_dict()
    return d


def _plots_html(doc: Mapping[str, Any], no_plots: str | None) -> str:
    """The plots section: a key to the marks, then one figure per series the history has; or,
    without a healthy step or with ``no_plots`` given, the sentence that says why not."""
    why = no_plots or _no_plots(doc)
    plots = [] if why else _plots(doc)
    if not plots:
        return (f"<section class='card' id='plots'><h2>Over the run</h2><p id='no-plots'>"
                f"{_e(why or 'No steps were recorded.')}</p></section>")
    m = _marks(doc)
    items = []
    if m.first_bad is not None:
        items.append(f"<span style='border-top:2px solid {_C_FAIL}'></span>first non-finite "
                     f"step ({_e(m.first_bad)})")
    if m.rollbacks:
        items.append(f"<span style='border-top:2px dashed {_C_ROLLBACK}'></span>rollback "
                     "(shaded: the steps it undid)")
    if m.skips:
        items.append(f"<span style='border-top:2px dotted {_C_SKIP}'></span>skipped step")
    if any(r.get("finite") is False for r in doc.get("history", [])):
        items.append(f"<span style='border-top:0'></span><b style='color:{_C_FAIL}'>✕</b> a "
                     "NaN/Inf value (no height to plot)")
    key = f"<p class='legend-key'>Marks:{''.join(items)}</p>" if items else ""
    figs = []
    for pid, title, caption, svg in plots:
        wide = " class='wide'" if pid == "plot-loss" else ""
        figs.append(f"<figure id='{pid}'{wide}><figcaption><b>{_e(title)}</b>{_e(caption)}"
                    f"</figcaption>{svg}</figure>")
    return (f"<section id='plots'><h2>Over the run</h2>{key}<div class='plots'>"
            f"{''.join(figs)}</div></section>")


def render_report(log: RunLog | Mapping[str, Any], *, no_plots: str | None = None) -> str:
    """The report of ``log`` (a :class:`~nanguard.core.runlog.RunLog`, or the dict
    :meth:`RunLog.read` returns) as one HTML document. ``no_plots``: the plots are not drawn and
    this sentence stands in their place (``nanguard run`` interrupted: drawing them takes
    seconds)."""
    doc = _doc(log)
    status = str(doc.get("status") or "ok")
    word, tone = _STATUS_WORDS.get(status, (status, "warn"))
    script = doc.get("script") or "(in-process run)"
    events = _dedupe(doc.get("events") or [])
    recs = doc.get("recoveries") or []

    meta = [f"script <code>{_e(script)}</code>"]
    if doc.get("argv"):
        meta.append(f"args <code>{_e(' '.join(map(str, doc['argv'])))}</code>")
    meta.append(f"{_e(doc.get('steps', 0))} steps")
    if doc.get("duration_s") is not None:
        meta.append(f"{float(doc['duration_s']):.2f} s")
    if doc.get("framework"):
        meta.append(_e(doc["framework"]))
    if doc.get("exit_code") is not None:
        meta.append(f"exit status {_e(doc['exit_code'])}")

    body: list[str] = [
        "<header><h1>nanguard run report</h1>"
        f"<span class='badge {tone}' id='status'>{_e(word)}</span></header>",
        f"<p class='meta'>{' · '.join(meta)}</p>",
    ]
    if events:
        cls = "finding" if status in ("nonfinite", "error") else "recovered"
        title = "First non-finite value" if len(events) == 1 else (
            f"First non-finite value (1 of {len(events)} events)")
        intro = f"<p>{_e(_summary(doc))}</p>" if status != "nonfinite" else ""
        body.append(f"<section class='card {cls}' id='finding'><h2>{title}</h2>"
                    f"{intro}{_finding_html(events[0], 0)}</section>")
    else:
        cls = "healthy" if status == "ok" else "recovered"
        body.append(f"<section class='card {cls}' id='finding'><h2>Summary</h2>"
                    f"<p class='headline'>{_e(_summary(doc))}</p></section>")
    if doc.get("error"):
        body.append(f"<section class='card' id='error'><h2>Error</h2><pre>{_e(doc['error'])}</pre>"
                    "</section>")

    body.append(_warnings_html(doc.get("warnings") or []))
    body.append(_plots_html(doc, no_plots))
    body.append(_recoveries_html(recs))
    body.append(_later_events_html(events))
    notes = doc.get("notes") or []
    if notes:
        body.append("<section class='card' id='notes'><h2>Notes</h2><ul>"
                    + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul></section>")
    body.append(f"<footer>nanguard {_e(doc.get('nanguard', ''))} · run log schema "
                f"{_e(doc.get('schema', ''))} · this page is self-contained and works "
                "offline</footer>")
    title = f"nanguard · {word} · {os.path.basename(str(script))}"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width,initial-scale=1'>"
        f"<title>{_e(title)}</title><style>{_CSS}</style></head>"
        f"<body><main>{''.join(body)}</main><script>{_JS}</script></body></html>\n"
    )


def needs_plots(log: RunLog | Mapping[str, Any]) -> bool:
    """Whether the report of ``log`` has plots to draw (a healthy step in its history): drawing
    them imports matplotlib and lays out five figures, seconds in all; without them the report
    takes milliseconds. Asked by ``nanguard run`` when it is interrupted."""
    return _no_plots(_doc(log)) is None


def write_report(log: RunLog | Mapping[str, Any], path: str, *, no_plots: str | None = None) -> None:
    """Write the report of ``log`` to ``path`` atomically (called at the end of a run, or by
    ``nanguard report``); the folder must exist. ``no_plots``: as for :func:`render_report`.
    Drawing the plots needs matplotlib (``pip install 'nanguard[report]'``); a report without
    them does not."""
    doc = _doc(log)
    if no_plots is None and _no_plots(doc) is None:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise ImportError(
                "nanguard's HTML report draws its plots with matplotlib: "
                "pip install 'nanguard[report]' (or: pip install matplotlib)"
            ) from exc
    write_atomic(path, render_report(doc, no_plots=no_plots), suffix=".html")
