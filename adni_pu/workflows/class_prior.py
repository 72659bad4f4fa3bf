"""The class prior of a run: one owner, from a given value, the cohort's truth or an estimate.

Every command that trains with a class prior (``train``, ``prior``, ``benchmark``,
``demo``) resolves it with :func:`resolve_prior`, which returns one :class:`ClassPrior`:
the value, its source (``given``, ``cohort``, ``estimate`` or ``placeholder``), whether the
method reads it, and the records ``run.json`` / ``result.json`` keep (``prior`` and
``prior_estimate``). Methods that read no prior (:func:`reads_no_prior`: naive PN, and VPU
chosen by a prior-free criterion) are never given an estimate: its classifier is not
trained, and the PU data carry the cohort's value or a placeholder, recorded as unread.

An estimate (:mod:`adni_pu.workflows.prior`, best-bin estimation on a P-vs-U classifier's
validation scores) is only made from enough validation scans (:data:`MIN_LABELLED_VAL`,
:data:`MIN_UNLABELLED_VAL`: :func:`check_estimable_counts`), and one whose bootstrap
interval collapses is "not estimable" (:func:`collapse_reason`) and never trained with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from adni_pu.errors import VolumeRunError

SOURCES = ("given", "cohort", "estimate", "placeholder")
"""Where a run's class prior comes from."""

MIN_LABELLED_VAL = 10
"""Fewest labelled positives in the validation split for an estimate. BBE's upper bound
adds (1 + gamma) sqrt(ln(1/delta) / 2 n_p) / q_p to each threshold's q_u / q_p: with
delta = 0.1 that slack is 1.07 / sqrt(n_p), 0.34 at 10 positives and 0.48 at 5, so below 10
it outweighs any q_u / q_p gain and the chosen bin is all positives; one positive then moves
the top bin's q_p by more than 10 %, and a percentile bootstrap of n_p positives has only
C(2 n_p - 1, n_p) distinct resamples (1 at n_p = 1, 126 at 5, 92,378 at 10), too few below
10 for its 2.5 % tails to mean anything."""
MIN_UNLABELLED_VAL = 10
"""Fewest unlabelled validation scans for an estimate: alpha is a fraction of them, so each
one moves it by 1 / n_u (10 % at 10); the same DKW slack and bootstrap argument as
:data:`MIN_LABELLED_VAL` holds for U."""

CAP = 1 - 1e-3
"""The largest prior (and alpha) an estimate gives (:func:`adni_pu.pu.prior_estimate.
estimate_prior` clips to [1e-3, 1 - 1e-3])."""

#: Methods whose loss reads no class prior, and selection criteria that read none.
PRIOR_FREE_METHODS = ("naive", "vpu")
PRIOR_FREE_CRITERIA = ("pu_auc", "variational", "pn_accuracy")


@dataclass(frozen=True)
class ClassPrior:
    """A run's class prior, resolved once (:func:`resolve_prior`)."""

    value: float
    source: str
    """One of :data:`SOURCES`."""
    read_by_method: bool
    """False where neither the loss nor the model selection reads it."""
    record: dict[str, Any]
    """``run.json``'s ``prior``: ``prior`` (the value), ``source`` (a sentence), the counts
    behind a cohort value, ``read_by_method`` where False."""
    estimate: dict[str, Any] | None = None
    """``run.json``'s ``prior_estimate``: the estimate's record (value, CI, counts, its
    classifier), None unless the source is ``estimate``."""
    note: str = ""
    """One line for the person running the command where the prior is estimated (the value
    and its CI) or its estimate skipped (and why); empty otherwise."""


def reads_no_prior(method: str, val_criterion: str) -> bool:
    """Whether neither the loss of ``method`` nor the selection criterion reads the class
    prior (then estimation is skipped, and a cohort without truth trains with a
    placeholder prior, recorded as such)."""
    return method in PRIOR_FREE_METHODS and val_criterion in PRIOR_FREE_CRITERIA


def cohort_prior(manifest: Any) -> tuple[float, int, int]:
    """Positive fraction (by the truth) among the training subjects with known truth.

    Returns (prior, subjects with truth, subjects without truth) of the ``train`` split.
    """
    import pandas as pd

    from adni_pu.cohort.ids import scans_by_subject

    train = scans_by_subject(manifest[manifest["split"] == "train"])
    per_subject = train.groupby("subject_id")["truth"].first()
    known = per_subject.dropna()
    n_unknown = int(per_subject.isna().sum())
    if known.empty:
        raise VolumeRunError("no training subject has a known truth, so the class prior "
                             "cannot come from the cohort; set it with --set prior=0.5")
    prior = float(pd.to_numeric(known).mean())
    return prior, int(len(known)), n_unknown


def placeholder_prior(scheme: str, n_labelled: int, n_total: int) -> float:
    """The class prior PU data are built with where nothing reads it: alpha = 1/2 as a
    stand-in (naive training and the P-vs-U AUC use no prior; PUData needs one)."""
    from adni_pu.pu.prior_estimate import prior_from_alpha

    return prior_from_alpha(0.5, scheme, n_labelled, n_total)  # type: ignore[arg-type]


def check_estimable_counts(n_labelled: int, n_unlabelled: int, what: str = "scans") -> None:
    """Refuse an estimate from fewer than :data:`MIN_LABELLED_VAL` labelled positives or
    :data:`MIN_UNLABELLED_VAL` unlabelled validation ``what``, saying what is needed."""
    if n_labelled >= MIN_LABELLED_VAL and n_unlabelled >= MIN_UNLABELLED_VAL:
        return
    raise VolumeRunError(
        f"the validation split holds {n_labelled} labelled positive and {n_unlabelled} "
        f"unlabelled {what}: estimating the class prior needs at least {MIN_LABELLED_VAL} "
        f"labelled positive and {MIN_UNLABELLED_VAL} unlabelled validation {what} (below "
        "that, best-bin estimation and its bootstrap interval are not informative); give "
        "the validation split more subjects, or set the prior with --set prior=VALUE")


def collapse_reason(record: dict[str, Any]) -> str | None:
    """Why an estimate's bootstrap interval says nothing (None when it does): zero width,
    or an upper end at the cap, where the resampled validation scans cannot rule out that
    every unlabelled scan is positive."""
    low, high = float(record["ci_low"]), float(record["ci_high"])
    if high - low <= 1e-9:
        return f"its bootstrap interval has zero width ([{low:.3f}, {high:.3f}])"
    if high >= CAP - 1e-9:
        return (f"its bootstrap interval reaches the cap {CAP} ([{low:.3f}, {high:.3f}]): "
                "the validation scans cannot rule out that every unlabelled scan is positive")
    return None


def estimate_line(record: dict[str, Any]) -> str:
    """An estimate in one line: the value and its CI, or "not estimable" and why; beside
    the cohort's truth where it has one."""
    counts = (f"{record['method']}, from {record['n_positive']} labelled and "
              f"{record['n_unlabelled']} unlabelled validation scans")
    reason = collapse_reason(record)
    if reason is not None:
        text = f"class prior not estimable ({counts}): {reason}"
    else:
        text = (f"class prior estimate {record['value']:.3f} [95 % CI {record['ci_low']:.3f}, "
                f"{record['ci_high']:.3f}] ({counts})")
    truth = record.get("true_prior")
    return text + ("; " + (f"positive fraction by the cohort's truth: {truth:.3f}"
                           if truth is not None else "the cohort has no truth to compare"))


def _missing(what: str) -> Any:
    """A source left out by a caller whose setting never needs it: a programming error."""
    def fail() -> Any:
        raise ValueError(f"resolve_prior: this setting needs {what}, and none was given")
    return fail


def resolve_prior(setting: float | str | None, *,
                  truth: Callable[[], tuple[float, dict[str, Any]]] | None = None,
                  estimate: Callable[[], dict[str, Any] | None] | None = None,
                  placeholder: Callable[[], float] | None = None, reads_prior: bool = True
                  ) -> ClassPrior | None:
    """The class prior of a run from its ``setting``: a number (given), ``"cohort"`` or
    None (the cohort's truth: ``truth()`` gives the value and the record's counts, and
    raises :class:`VolumeRunError` where there is none), or ``"estimate"`` (``estimate()``
    gives its record; None where a deadline stopped its classifier, and then so is this).

    Where the method reads no prior (``reads_prior`` False) nothing is estimated: the PU
    data carry the cohort's value, or ``placeholder()`` where the cohort has no truth. An
    estimate whose interval collapses (:func:`collapse_reason`) is refused. A source the
    setting does not need may be left out.
    """
    truth = truth or _missing("the cohort's truth")
    estimate = estimate or _missing("an estimate")
    placeholder = placeholder or _missing("a placeholder")
    if not reads_prior and not isinstance(setting, (int, float)):
        skipped = setting == "estimate"
        try:
            value, counts = truth()
            record = {"prior": value, "source": "cohort: positive fraction (by the truth) of "
                      "the training subjects with known truth", **counts}
            source = "cohort"
        except VolumeRunError:
            value, source = placeholder(), "placeholder"
            record = {"prior": value, "source": "placeholder (the cohort has no truth; the "
                      "method and its model selection read no class prior)"}
        record["read_by_method"] = False
        if skipped:
            record["estimate_skipped"] = "the method and its model selection read no class prior"
        note = ("class prior: not estimated: this method and its model selection read no "
                "class prior" if skipped else "")
        return ClassPrior(value, source, False, record, None, note)
    if isinstance(setting, (int, float)) and not isinstance(setting, bool):
        value = float(setting)
        record = {"prior": value, "source": "setting"}
        if not reads_prior:
            record["read_by_method"] = False
        return ClassPrior(value, "given", reads_prior, record)
    if setting in (None, "cohort"):
        value, counts = truth()
        record = {"prior": value, "source": "cohort: positive fraction (by the truth) of the "
                  "training subjects with known truth", **counts}
        return ClassPrior(value, "cohort", True, record)
    if setting != "estimate":
        raise VolumeRunError(f"prior: expected a number in (0, 1), 'cohort' or 'estimate', "
                             f"found {setting!r}")
    found = estimate()
    if found is None:
        return None
    reason = collapse_reason(found)
    if reason is not None:
        raise VolumeRunError(f"{estimate_line(found)}; set the prior with --set prior=VALUE, "
                             "or give the validation split more subjects")
    value = float(found["value"])
    return ClassPrior(value, "estimate", True,
                      {"prior": value, "source": "estimate (prior_estimate.json)"}, found,
                      f"training with the {estimate_line(found)}")
