"""Settings of the cohort builder (one typed object) and its named label presets.

A preset is only a set of defaults for :class:`LabelSettings`; every value it sets is a
visible setting that a TOML file or ``--set labels.key=value`` can change. The resolved
settings are written next to the manifest, so the same file rebuilds the same cohort.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from adni_pu import config as cfgmod
from adni_pu.errors import ConfigError

#: Amyloid tracers known to the builder (ADNIMERGE column names).
TRACERS: tuple[str, ...] = ("AV45", "FBB", "PIB")
#: Tracers an amyloid measure may carry: ADNIMERGE's three, plus NAV (NAV4694), which only
#: the UC Berkeley tables (``--amyloid``) carry. Florbetapir is AV45 (Berkeley: FBP).
MEASURE_TRACERS: tuple[str, ...] = (*TRACERS, "NAV")
#: UC Berkeley whole-cerebellum SUVR -> Centiloid conversions (slope, intercept), from the
#: ADNI document "Instructions for converting ADNI processing results to Centiloids"
#: (UC Berkeley / Jagust lab, on LONI IDA); see docs/cohort.md.
BERKELEY_CENTILOID: dict[str, list[float]] = {"AV45": [188.22, -189.16], "FBB": [157.15, -151.87]}


@dataclass
class ClinicalColumns:
    """Where each field lives in the clinical table; ``""`` means "find it by known names".

    The defaults find ADNIMERGE's own names (RID, PTID, VISCODE, EXAMDATE, DX_bl, DX, AGE,
    PTGENDER, AV45, FBB, PIB); a generic table sets the names it uses, e.g.
    ``subject = "participant_id"``. ``"-"`` marks a field the table does not have.
    """

    subject: str = ""
    rid: str = ""
    visit: str = ""
    date: str = ""
    dx: str = ""
    dx_bl: str = ""
    age: str = ""
    sex: str = ""
    av45: str = ""
    fbb: str = ""
    pib: str = ""


@dataclass
class ScanColumns:
    """Where each field lives in the scan table (preprocessing summary.csv or generic).

    ``""`` means "find it by known names": summary.csv's subject_id, session_id,
    preprocessed_path and status, or a generic table's subject, session, path, date.
    ``"-"`` marks a field the table does not have.
    """

    subject: str = ""
    session: str = ""
    path: str = ""
    date: str = ""
    status: str = ""


@dataclass
class MatchingSettings:
    """How a scan finds its clinical visit and its amyloid measure."""

    # Amyloid measures farther than this from the scan date are not paired with it.
    amyloid_window_days: int = 365
    # A scan whose visit code has no clinical row is paired with the subject's nearest
    # visit by date, if the scan has a date and the visit lies within this many days.
    visit_window_days: int = 90
    # Visit codes tried, in order, when a scan's own code has no clinical row
    # (ADNI's screening visits sit a few weeks before baseline).
    visit_aliases: dict[str, list[str]] = field(
        default_factory=lambda: {"sc": ["bl"], "scmri": ["bl", "sc"], "bl": ["sc", "scmri"]}
    )
    # When two measures are equally near, the tracer listed first wins.
    tracer_priority: list[str] = field(default_factory=lambda: list(MEASURE_TRACERS))
    # summary.csv status values whose scans are usable; other rows are excluded (reported).
    usable_statuses: list[str] = field(default_factory=lambda: ["done", "skipped"])

    def __post_init__(self) -> None:
        if self.amyloid_window_days < 0 or self.visit_window_days < 0:
            raise ConfigError(
                f"matching windows must be >= 0 days, found amyloid_window_days="
                f"{self.amyloid_window_days}, visit_window_days={self.visit_window_days}"
            )
        self.tracer_priority = [t.upper() for t in self.tracer_priority]
        unknown = sorted(set(self.tracer_priority) - set(MEASURE_TRACERS))
        if unknown:
            raise ConfigError(
                f"tracer_priority: unknown tracer(s) {unknown}; expected {MEASURE_TRACERS}")
        aliases: dict[str, list[str]] = {}
        for key, value in self.visit_aliases.items():
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise ConfigError(
                    f"visit_aliases.{key}: expected a list of visit codes, found {value!r}")
            aliases[str(key).lower()] = [v.lower() for v in value]
        self.visit_aliases = aliases


def _check_cutoffs(name: str, cutoffs: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in cutoffs.items():
        tracer = str(key).upper()
        if tracer not in MEASURE_TRACERS:
            raise ConfigError(
                f"{name}: unknown tracer {key!r}; expected some of {list(MEASURE_TRACERS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{name}.{key}: expected a positive SUVR, found {value!r}")
        out[tracer] = float(value)
    return out


@dataclass
class LabelSettings:
    """The positive-unlabelled labelling rule and the evaluation truth (per subject).

    Two rules, kept apart on purpose (docs/cohort.md, "Labels and truth"):

    - **Label** (what training sees). A subject is a labelled positive (pu_label 1) if one
      of ``positive_diagnoses`` is on file for it (within ``diagnosis_scope``), or, where
      ``label_cutoffs`` names its tracer, an amyloid measure (within ``amyloid_scope``) at
      or above that cut-off. Everyone else is unlabelled (0). The ``paper`` preset labels
      by diagnosis alone (``label_cutoffs`` empty), as the paper does: "patients" are
      labelled, the rest are unlabelled.
    - **Truth** (evaluation only), the positive class: 1 if a measure is at or above
      ``truth_cutoffs[tracer]``, or (``truth_from_diagnosis``) a positive diagnosis is on
      file; 0 if the subject has measures, all below, and no positive diagnosis; unknown
      otherwise.

    An unlabelled subject whose truth is positive is a **hidden positive**: what a PU
    method has to find. A label cut-off may not lie below the truth cut-off (a labelled
    positive must be positive).

    With ``scale = "centiloid"`` the measures are Centiloids (the table's own, or SUVRs
    converted by ``amyloid.centiloid_conversions``) and the ``centiloid_*`` cut-offs apply
    to every tracer alike. ``diagnosis_only = true`` makes no amyloid label whatever the
    cut-offs say, and accepts inputs with no amyloid measure at all (truth then known only
    where a diagnosis decides it).
    """

    positive_diagnoses: list[str] = field(default_factory=lambda: ["AD", "Dementia"])
    # Keep only subjects whose baseline diagnosis (normalised CN/MCI/AD, or DX_bl's own
    # CN/SMC/EMCI/LMCI/AD) is listed; empty keeps everyone.
    include_diagnoses: list[str] = field(default_factory=list)
    # SUVR at or above which an amyloid measure alone labels a subject positive; a tracer
    # not listed (the paper: none) makes no label.
    label_cutoffs: dict[str, float] = field(default_factory=dict)
    truth_cutoffs: dict[str, float] = field(
        default_factory=lambda: {"AV45": 1.08, "FBB": 1.08, "PIB": 1.08})
    # The positive class includes a positive diagnosis on file (the paper's wording:
    # "a positive clinical diagnosis, or SUVR >= 1.08"); false: amyloid status alone.
    truth_from_diagnosis: bool = True
    # Which diagnoses count: every visit on file, only visits with a scan, or baseline only.
    diagnosis_scope: Literal["any-visit", "scanned-visits", "baseline"] = "any-visit"
    # Which amyloid measures count: those paired with one of the subject's scans, or all.
    amyloid_scope: Literal["paired", "any"] = "paired"
    # What the cut-offs compare: per-tracer SUVRs or tracer-agnostic Centiloids.
    scale: Literal["suvr", "centiloid"] = "suvr"
    # Centiloids at or above which a measure labels a subject positive (none: no label).
    centiloid_label_cutoff: float | None = None
    centiloid_truth_cutoff: float = 20.0
    # No amyloid label at all, and inputs without any amyloid measure are accepted.
    diagnosis_only: bool = False

    def __post_init__(self) -> None:
        self.label_cutoffs = _check_cutoffs("labels.label_cutoffs", self.label_cutoffs)
        self.truth_cutoffs = _check_cutoffs("labels.truth_cutoffs", self.truth_cutoffs)
        for tracer, label in self.label_cutoffs.items():
            truth = self.truth_cutoffs.get(tracer)
            if truth is not None and label < truth:
                raise ConfigError(
                    f"labels.label_cutoffs.{tracer}={label}: expected at or above "
                    f"labels.truth_cutoffs.{tracer}={truth} (a labelled positive must be "
                    "positive by the truth)")
        low = self.centiloid_label_cutoff
        if low is not None and low < self.centiloid_truth_cutoff:
            raise ConfigError(
                f"labels.centiloid_label_cutoff={low}: expected at or above "
                f"labels.centiloid_truth_cutoff={self.centiloid_truth_cutoff}")

    def amyloid_labels(self) -> bool:
        """Whether any amyloid measure can make a labelled positive under these settings."""
        if self.diagnosis_only:
            return False
        if self.scale == "centiloid":
            return self.centiloid_label_cutoff is not None
        return bool(self.label_cutoffs)


@dataclass
class AmyloidSettings:
    """How amyloid tables (``--amyloid``, e.g. UC Berkeley's) are read and combined."""

    # qc_flag values whose rows are used. UC Berkeley tables: 2 pass, 1 partial pass,
    # 0 fail, -1 not assessed. Rows with another or an empty qc_flag are left out and
    # reported; a table without a qc_flag column is used as it is.
    qc_pass: list[int] = field(default_factory=lambda: [2])
    # With --amyloid tables: "tables-first" uses a subject's table measures instead of the
    # clinical table's AV45/FBB/PIB (copies dated by the visit, not the scan) and keeps the
    # clinical ones for subjects the tables lack; "tables-only" ignores the clinical
    # table's amyloid columns; "pooled" uses both.
    precedence: Literal["tables-first", "tables-only", "pooled"] = "tables-first"
    # SUVR -> Centiloid per tracer, [slope, intercept], for measures without a Centiloid
    # of their own (labels.scale = "centiloid"). No PIB or NAV conversion by default.
    centiloid_conversions: dict[str, list[float]] = field(
        default_factory=lambda: copy.deepcopy(BERKELEY_CENTILOID))

    def __post_init__(self) -> None:
        out: dict[str, list[float]] = {}
        for key, value in self.centiloid_conversions.items():
            tracer = str(key).upper()
            if tracer not in MEASURE_TRACERS:
                raise ConfigError(f"amyloid.centiloid_conversions: unknown tracer {key!r}; "
                                 f"expected some of {list(MEASURE_TRACERS)}")
            if (not isinstance(value, (list, tuple)) or len(value) != 2
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                               for v in value) or value[0] <= 0):
                raise ConfigError(f"amyloid.centiloid_conversions.{key}: expected [slope, "
                                 f"intercept] with a positive slope, found {value!r}")
            out[tracer] = [float(value[0]), float(value[1])]
        self.centiloid_conversions = out


@dataclass
class SplitSettings:
    """Subject-level train/validation/test split, optionally k folds over train+val."""

    seed: int = 0
    test_fraction: float = 0.15
    val_fraction: float = 0.15
    # k >= 2: the non-test subjects get folds 0..k-1; fold ``fold`` is the validation split.
    k_folds: int = 0
    fold: int = 0
    # Strata: pu_label x truth (unknown truth is a stratum of its own).
    stratify: bool = True
    # Order subjects by sex and age inside each stratum before allocating, so each split
    # gets a similar mix of both.
    balance_covariates: list[str] = field(default_factory=lambda: ["sex", "age"])

    def __post_init__(self) -> None:
        if not 0.0 <= self.test_fraction < 1.0:
            raise ConfigError(f"split.test_fraction={self.test_fraction}: expected in [0, 1)")
        if self.k_folds == 1 or self.k_folds < 0:
            raise ConfigError(f"split.k_folds={self.k_folds}: expected 0 (no folds) or >= 2")
        if self.k_folds >= 2:
            if not 0 <= self.fold < self.k_folds:
                raise ConfigError(f"split.fold={self.fold}: expected 0..{self.k_folds - 1}")
        elif not 0.0 <= self.val_fraction < 1.0 or self.val_fraction + self.test_fraction >= 1.0:
            raise ConfigError(
                f"split.val_fraction={self.val_fraction}, test_fraction={self.test_fraction}: "
                "expected each in [0, 1) and together below 1"
            )
        unknown = sorted(set(self.balance_covariates) - {"sex", "age"})
        if unknown:
            raise ConfigError(f"split.balance_covariates: unknown {unknown}; expected sex, age")


@dataclass
class OutputSettings:
    """What the manifest looks like on disk."""

    format: Literal["csv", "parquet"] = "csv"
    # Scan paths in the manifest: absolute (relative ones in the scan table are read from
    # the scan table's folder), relative to the manifest's folder, or exactly as given.
    scan_paths: Literal["absolute", "relative", "as-given"] = "absolute"


@dataclass
class CohortConfig:
    """Everything the cohort builder needs besides the input tables."""

    preset: str = "paper"
    clinical_columns: ClinicalColumns = field(default_factory=ClinicalColumns)
    scan_columns: ScanColumns = field(default_factory=ScanColumns)
    matching: MatchingSettings = field(default_factory=MatchingSettings)
    labels: LabelSettings = field(default_factory=LabelSettings)
    amyloid: AmyloidSettings = field(default_factory=AmyloidSettings)
    split: SplitSettings = field(default_factory=SplitSettings)
    output: OutputSettings = field(default_factory=OutputSettings)
    # Leave out (and list in excluded.csv) scans whose file does not exist; false keeps them
    # unchecked, for a manifest built on another machine than the one that trains.
    check_scan_files: bool = True

    def __post_init__(self) -> None:
        if self.preset not in LABEL_PRESETS:
            raise ConfigError(f"preset {self.preset!r}: expected one of {sorted(LABEL_PRESETS)}")


#: Label presets: the defaults each one gives to :class:`LabelSettings`. Every preset
#: but ``labels-equal-truth`` leaves amyloid-positive people without a positive diagnosis
#: unlabelled: the hidden positives a PU method has to find.
LABEL_PRESETS: dict[str, dict[str, Any]] = {
    "paper": {
        "positive_diagnoses": ["AD", "Dementia"],
        "include_diagnoses": [],
        "label_cutoffs": {},
        "truth_cutoffs": {"AV45": 1.08, "FBB": 1.08, "PIB": 1.08},
        "truth_from_diagnosis": True,
    },
    "published-code": {
        "positive_diagnoses": ["AD", "Dementia"],
        "include_diagnoses": ["CN", "AD"],
        "label_cutoffs": {"AV45": 1.18, "FBB": 1.18, "PIB": 1.18},
        "truth_cutoffs": {"AV45": 1.08, "FBB": 1.08, "PIB": 1.08},
        "truth_from_diagnosis": True,
    },
    "tracer-cutoffs": {
        "positive_diagnoses": ["AD", "Dementia"],
        "include_diagnoses": [],
        "label_cutoffs": {},
        "truth_cutoffs": {"AV45": 1.11, "FBB": 1.08, "PIB": 1.5},
        "truth_from_diagnosis": True,
    },
    "centiloid": {
        "positive_diagnoses": ["AD", "Dementia"],
        "include_diagnoses": [],
        "label_cutoffs": {},
        "scale": "centiloid",
        "centiloid_label_cutoff": None,
        "centiloid_truth_cutoff": 20.0,
        "truth_from_diagnosis": True,
    },
    "labels-equal-truth": {
        "positive_diagnoses": ["AD", "Dementia"],
        "include_diagnoses": [],
        "label_cutoffs": {"AV45": 1.08, "FBB": 1.08, "PIB": 1.08},
        "truth_cutoffs": {"AV45": 1.08, "FBB": 1.08, "PIB": 1.08},
        "truth_from_diagnosis": True,
    },
}

PRESET_DESCRIPTIONS: dict[str, str] = {
    "paper": "Self-PU paper: AD/Dementia on file labelled; truth = that diagnosis or "
             "SUVR >= 1.08; amyloid-positive MCI/CN hidden in the unlabelled set",
    "published-code": "published code: CN and AD subjects only; AD or SUVR >= 1.18 labelled, "
                      "1.08-1.18 hidden positives",
    "tracer-cutoffs": "the paper's labels with per-tracer truth cut-offs: AV45 1.11, FBB 1.08, "
                      "PIB 1.5",
    "centiloid": "the paper's labels with a tracer-agnostic truth: diagnosis or >= 20 "
                 "Centiloids (Berkeley SUVR conversions for AV45/FBB)",
    "labels-equal-truth": "every known positive labelled (AD/Dementia or SUVR >= 1.08): "
                          "labels equal the truth, a supervised task, not PU (the "
                          "`paper` rule before 2026-11-26; for comparison only)",
}


def load_cohort_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    preset: str | None = None,
    values: dict[str, Any] | None = None,
) -> CohortConfig:
    """Resolve settings: preset defaults, then the TOML file, then ``values`` (a nested dict
    given by library code), then ``key=value`` overrides.

    The preset is, in order of precedence: ``preset``, a ``preset=`` override,
    ``values["preset"]``, the file's ``preset`` key, ``"paper"``.
    """
    name = cfgmod.preset_choice(path, overrides, preset, "paper", values)
    defaults = {"preset": name, "labels": cfgmod.preset_table(LABEL_PRESETS, name)}
    if preset is None:
        return cfgmod.load(CohortConfig, path, overrides, defaults=defaults, values=values)
    return cfgmod.load(CohortConfig, path, cfgmod.without_preset(overrides), defaults,
                        values={**(values or {}), "preset": preset})


def positive_class_text(labels: LabelSettings) -> str:
    """The positive class these settings define (the truth's rule), in words a reader of a
    prediction needs: e.g. "a positive clinical diagnosis (AD, Dementia) or amyloid SUVR >=
    1.08 (AV45, FBB, PIB)". A model trained on the cohort estimates this class, not amyloid
    status alone (unless the settings say so)."""
    if labels.scale == "centiloid":
        amyloid = f"amyloid >= {labels.centiloid_truth_cutoff:g} Centiloids"
    else:
        by_cut: dict[float, list[str]] = {}
        for tracer, cut in sorted(labels.truth_cutoffs.items()):
            by_cut.setdefault(float(cut), []).append(tracer)
        amyloid = " or ".join(f"amyloid SUVR >= {cut:g} ({', '.join(tracers)})"
                              for cut, tracers in sorted(by_cut.items()))
    diagnosis = f"a positive clinical diagnosis ({', '.join(labels.positive_diagnoses)})"
    if labels.diagnosis_only or not amyloid:
        return diagnosis
    return f"{diagnosis} or {amyloid}" if labels.truth_from_diagnosis else amyloid
