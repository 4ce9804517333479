"""Rules for values that were non-finite before any op made them: the batch, the weights, and
a non-finite literal (a ``-inf`` mask) written by the code."""

from __future__ import annotations

from ..case import Case, Diagnosis
from ..ops import canonical_op, op_traits
from ..taxonomy import Cause

__all__ = [
    "batch_holds_nonfinite",
    "explicit_nonfinite_constant",
    "mask_row_became_nan",
    "weights_already_nonfinite",
]


def batch_holds_nonfinite(case: Case) -> Diagnosis | None:
    """The input batch itself held NaN/Inf (the data phase)."""
    ev, say = case.ev, case.say
    if ev.phase != "data":
        return None
    lines: list[str] = []
    name = ev.provenance.input_name or "the batch"
    for s in ev.provenance.samples[:3]:
        feats = s.features or ()
        where = (f", feature{'s' if len(feats) > 1 else ''} {', '.join(map(str, feats[:6]))}"
                 if feats else "")
        which = (f"dataset index {s.dataset_index} (sample {s.index} of {name})"
                 if s.dataset_index is not None else f"sample {s.index} of {name}")
        lines.append(f"{which}{where} {'are' if len(feats) > 1 else 'is'} {s.kind}")
    if len(ev.provenance.samples) > 3:
        lines.append(f"… and {len(ev.provenance.samples) - 3} more samples")
    if not lines:
        before = "" if ev.provenance.origin == "unrecorded" else " before any operation ran"
        lines.append(f"{name} holds {ev.what}{before}")
    if ev.provenance.origin == "computed":
        return _computed(case, lines)
    if ev.provenance.read_computed:
        return _read_computed(case, lines)
    if ev.provenance.origin == "unrecorded":
        return _unrecorded(case, lines)
    fixes = [
        say.data.drop_bad_samples,
        "nanguard scan <your data file>  # find every bad row and column",
        "df = df.dropna()  # or df.fillna(...) before building tensors from a DataFrame",
    ]
    return Diagnosis(
        Cause.NONFINITE_INPUT, 0.95, f"the input batch already holds {ev.what}", lines, fixes
    )


def weights_already_nonfinite(case: Case) -> Diagnosis | None:
    """A weight was non-finite before the step began (a corrupt checkpoint, a bad init)."""
    ev, say = case.ev, case.say
    if ev.op != "parameter" and ev.provenance.origin != "parameter":
        return None
    names = list(ev.provenance.parameters) or ([ev.module] if ev.module else [])
    lines = [f"`{n}` was non-finite before the step began" for n in names[:4]] or [
        "a weight was non-finite before the step began"
    ]
    if ev.step in (0, None) or case.trend.healthy_steps == 0:
        lines.append("no healthy step ran before: the weights came in bad (loaded checkpoint or init)")
    return Diagnosis(
        Cause.NONFINITE_PARAMETERS, 0.9, "the weights were already non-finite", lines,
        [say.data.check_weights, say.data.load_checkpoint],
    )


def mask_row_became_nan(case: Case) -> Diagnosis | None:
    """An intended ``-inf`` (a mask) was harmless until this op made NaN of it: a softmax over a
    row that is masked entirely is 0/0."""
    ev, say = case.ev, case.say
    mask = ev.provenance.masked_inf
    if mask is None:
        return None
    by = f"`{canonical_op(mask.op)}`" + (f" at {mask.source}" if mask.source else "")
    entire = op_traits(ev.op_name).softmax
    lines = [
        (f"`{case.shown}` {ev.where} received a row that is -inf everywhere (every position masked) "
         f"and made {ev.what}: softmax of only -inf is 0/0") if entire else
        (f"`{case.shown}` {ev.where} turned the -inf of a mask into {ev.what}"),
        f"the -inf came from {by}: on its own it is harmless; it is this {case.shown} that made NaN",
    ]
    x = ev.input(0)
    if x is not None and x.neginf:
        lines.append(f"its input held {x.neginf} -inf out of {x.numel}")
    fixes = [
        say.masks.mask_with_finite_min,
        "make sure every query keeps at least one key (a padding row: mask it out of the loss, "
        "not out of the attention)",
    ]
    return Diagnosis(
        Cause.UNSAFE_OP, 0.85,
        "a row masked entirely: softmax over only -inf" if entire else "a -inf mask became NaN",
        lines, fixes,
    )


def explicit_nonfinite_constant(case: Case) -> Diagnosis | None:
    """The code wrote an explicit NaN/Inf (a ``-inf`` mask that reached the loss, a poisoned
    value)."""
    ev, say = case.ev, case.say
    const = ev.provenance.constant
    if const is None:
        return None
    lines = [f"`{case.shown}` {ev.where} wrote the literal {const} and it reached the {ev.reached or 'loss'}"]
    fixes = [
        say.masks.constant_with_finite_min,
        "make sure no row is masked entirely: softmax over only -inf is 0/0 = nan",
    ]
    if const == "nan":
        fixes = ["remove the assignment of nan, or write a finite value"]
    return Diagnosis(
        Cause.UNSAFE_OP, 0.8, f"an explicit {const} in your code reached the training", lines, fixes
    )


def _computed(case: Case, lines: list[str]) -> Diagnosis:
    """The bad tensor was made in this step from numbers the script computed in Python
    (``torch.tensor(returns)``): the computation is what to fix, not a data file."""
    ev = case.ev
    at = ev.source or "the line shown"
    lines = [f"it was made at {at} from numbers the script computed in Python (a return, a reward, "
             "a target), not loaded from data", *lines]
    fixes = [
        f"t = torch.tensor(values, dtype=torch.float64); assert torch.isfinite(t.float()).all()  # at {at}: "
        "float32 overflows above 3.4e38 even where the Python floats are finite",
        "check the computation that makes them: a recurrence such as R = r + gamma * R grows "
        "geometrically for gamma >= 1; normalise or clamp before making the tensor",
    ]
    return Diagnosis(Cause.NONFINITE_INPUT, 0.95,
                     f"a tensor the script computed holds {ev.what}", lines, fixes)


def _read_computed(case: Case, lines: list[str]) -> Diagnosis:
    """The dataset holds the sample's values finite, and the batch had NaN/Inf: reading the
    sample made it (a per-sample normalisation of a blank image, a log of a zero count) — the
    code of ``__getitem__`` is what to fix, not a data file."""
    ev, where = case.ev, case.ev.provenance.read_computed
    row = next((s.dataset_index for s in ev.provenance.samples if s.dataset_index is not None), None)
    lines = [f"the values the dataset holds for index {row} are finite: {ev.what} was made when the "
             f"sample was read, in `{where}` (or a transform or collate_fn it calls)", *lines]
    fixes = [
        f"guard the computation in `{where}`: a division by a standard deviation, a norm or a sum "
        "that is 0 for a constant sample (x / x.std().clamp_min(1e-6)), a log of 0 (torch.log1p)",
        f"sample = dataset[{row}]  # the sample that failed: step through `{where}` with it",
    ]
    return Diagnosis(Cause.NONFINITE_INPUT, 0.9,
                     f"reading a sample made {ev.what} (`{where}`)", lines, fixes)


def _unrecorded(case: Case, lines: list[str]) -> Diagnosis:
    """The bad tensor was made where the watch records nothing to stay cheap (between a rollout's
    ``no_grad`` forwards, or in a rollout with grad gone lean): what the script built there, not
    a data file."""
    ev = case.ev
    at = f"it entered the update at {ev.source}; " if ev.source else ""
    lines = [f"{at}it was made in a part of the step where nanguard records no op to stay cheap "
             "(the forwards of a rollout): a return, advantage, reward or observation the script "
             "built there, not a batch from a DataLoader", *lines]
    fixes = [
        "check the computation that builds it: a recurrence such as R = r + gamma * R grows "
        "geometrically for gamma >= 1; normalise or clamp before making the tensor",
        "nanguard run --trace <script>  # records every op, so names the one that made it",
    ]
    return Diagnosis(Cause.NONFINITE_INPUT, 0.8,
                     f"a tensor the script built in this step holds {ev.what}", lines, fixes)
