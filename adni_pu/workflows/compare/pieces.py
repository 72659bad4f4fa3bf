"""The pieces of a comparison: one method x fold x seed each, trained by ``train_volumes``.

:func:`prepare` checks everything before any work (the manifest's labels, the methods,
the folds, the pieces asked for), records the manifest's content hash and the settings in
``OUT/comparison.json`` (a rerun with others is refused) and writes each fold's manifest
once. :func:`run_piece` trains one piece into ``OUT/pieces/<method>/fold-<k>/seed-<s>/``,
an ordinary run folder, holding that folder's lock (so several processes, or Slurm array
tasks with ``--piece i/N``, share one ``OUT``), scores the held-out fold (and the fixed test
set) with the selected model and writes the piece's results file ``piece.json`` last: a
piece with it is finished and skipped by a rerun; one without it resumes from its
checkpoint (``train_volumes``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from adni_pu import fileio
from adni_pu.errors import AdniPuError, ConfigError, ManifestError, ResumeError

METHODS = ("naive", "upu", "nnpu", "selfpu", "vpu", "nnpu-estimated")
#: Methods that are a training preset with settings of their own: name -> (preset, values
#: that replace the comparison's). ``nnpu-estimated``: nnPU with the class prior estimated
#: from each split's PU data alone (``prior = "estimate"``), what a cohort without amyloid
#: PET must use, beside nnPU given the cohort's prior.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "nnpu-estimated": ("nnpu", {"prior": "estimate"}),
}
#: The share of all subjects that validates in ``--holdout`` mode unless given.
HOLDOUT_VAL_FRACTION = 0.15
PIECE_FILE = "piece.json"
SETTINGS_FILE = "comparison.json"
TEST_MANIFEST = "independent_test.csv"


@dataclass(frozen=True)
class CompareSpec:
    """The settings of a comparison (what ``comparison.json`` records, less ``out``)."""

    manifest: str
    out: str
    methods: tuple[str, ...] = ("naive", "nnpu", "selfpu")
    folds: int = 5
    seeds: int = 1
    fold_seed: int = 0
    first_seed: int = 0
    """The training seeds are ``first_seed`` to ``first_seed + seeds - 1``."""
    test_size: int | None = None
    keep_test: bool = False
    prior: float | str = "cohort"
    config_file: str | None = None
    overrides: tuple[str, ...] = field(default_factory=tuple)
    holdout: int | None = None
    """Repeated hold-out instead of K folds: each training seed s gets its own subject
    split, this many subjects held out (``folds`` is then 1: the split is the one fold)."""
    val_fraction: float | None = None
    """The share of all subjects that validates in hold-out mode
    (:data:`HOLDOUT_VAL_FRACTION` unless given)."""

    @property
    def seed_values(self) -> tuple[int, ...]:
        """The training seeds, in order."""
        return tuple(range(self.first_seed, self.first_seed + self.seeds))

    def recorded(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("out")
        data.pop("manifest")
        if self.holdout is None:  # a K-fold comparison records what it always recorded
            data.pop("holdout")
            data.pop("val_fraction")
        elif self.val_fraction is None:  # the value used, given or not
            data["val_fraction"] = HOLDOUT_VAL_FRACTION
        return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}


@dataclass(frozen=True)
class Piece:
    """One method on one fold with one seed."""

    method: str
    fold: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.method}/fold-{self.fold}/seed-{self.seed}"


def all_pieces(spec: CompareSpec) -> list[Piece]:
    """Every piece, in a fixed order: seeds, then folds, then methods (so the first pieces
    done give every method one fold)."""
    return [Piece(m, k, s) for s in spec.seed_values for k in range(spec.folds)
            for m in spec.methods]


def piece_dir(out: Path, piece: Piece) -> Path:
    return Path(out) / "pieces" / piece.method / f"fold-{piece.fold}" / f"seed-{piece.seed}"


def fold_manifest(out: Path, fold: int) -> Path:
    return Path(out) / "folds" / f"fold-{fold}" / "manifest.csv"


def seed_manifest(out: Path, seed: int) -> Path:
    """Seed ``seed``'s hold-out manifest (``--holdout``)."""
    return Path(out) / "folds" / f"seed-{seed}" / "manifest.csv"


def piece_manifest(spec: CompareSpec, piece: Piece) -> Path:
    """The manifest a piece trains on: its fold's, or in hold-out mode its seed's."""
    if spec.holdout is not None:
        return seed_manifest(Path(spec.out), piece.seed)
    return fold_manifest(Path(spec.out), piece.fold)


def method_preset(method: str) -> tuple[str, dict[str, Any]]:
    """The training preset of ``method`` and the values it fixes (:data:`VARIANTS`)."""
    return VARIANTS.get(method, (method, {}))


def method_prior(spec: CompareSpec, method: str) -> float | str:
    """The class prior ``method`` trains with: its own (a variant's) or the comparison's."""
    return method_preset(method)[1].get("prior", spec.prior)


def val_fraction(spec: CompareSpec) -> float:
    """The validating share of all subjects in hold-out mode."""
    return HOLDOUT_VAL_FRACTION if spec.val_fraction is None else spec.val_fraction


def select_pieces(pieces: list[Piece], wanted: list[str]) -> list[Piece]:
    """The pieces named by ``--piece``: ``i/N`` (share i of N: every N-th piece from the
    i-th, the preprocess ``--shard`` convention) or ``i`` (the i-th piece, from 1); several
    may be given. None given: every piece."""
    from adni_pu.preprocessing.summary import parse_shard

    if not wanted:
        return list(pieces)
    chosen: list[int] = []
    for text in wanted:
        for part in str(text).split(","):
            if "/" in part:
                i, n = parse_shard(part)
                chosen += list(range(i - 1, len(pieces), n))
                continue
            if not part.strip().isdigit() or not 1 <= int(part) <= len(pieces):
                raise ConfigError(f"--piece {part!r}: expected i/N or a piece number from 1 "
                                  f"to {len(pieces)} (the comparison has {len(pieces)} pieces)")
            chosen.append(int(part) - 1)
    return [pieces[i] for i in sorted(set(chosen))]


def check_spec(spec: CompareSpec) -> None:
    """Refuse settings that cannot run, in one line each, before any work."""
    if not spec.methods:
        raise ConfigError("--methods: expected at least one of " + ", ".join(METHODS))
    for method in spec.methods:
        if method not in METHODS:
            raise ConfigError(f"--methods: unknown method {method!r}; expected some of "
                              + ", ".join(METHODS))
    if len(set(spec.methods)) != len(spec.methods):
        raise ConfigError(f"--methods {','.join(spec.methods)}: a method is named twice")
    if spec.holdout is not None:
        if spec.folds != 1 or spec.test_size or spec.keep_test:
            raise ConfigError("--holdout: a split per seed; it takes no --folds, --test-size "
                              "or --keep-test (its held-out subjects are each seed's test set)")
    elif spec.val_fraction is not None:
        raise ConfigError("--val-fraction: only with --holdout (a fold's validation split is a "
                          "fifth of its training part)")
    elif spec.folds < 2:
        raise ConfigError(f"--folds {spec.folds}: expected at least 2 (every subject is held "
                          "out by one fold)")
    fixed = [o for o in spec.overrides if o.split("=")[0].strip() in ("prior", "train.prior")]
    variants = [m for m in spec.methods if "prior" in method_preset(m)[1]]
    if fixed and variants:
        raise ConfigError(f"--set {fixed[0]}: {variants[0]} fixes the class prior "
                          f"({method_preset(variants[0])[1]['prior']}); give the others' "
                          "prior with --prior")
    if spec.seeds < 1:
        raise ConfigError(f"--seeds {spec.seeds}: expected at least 1")
    if spec.first_seed < 0:
        raise ConfigError(f"--first-seed {spec.first_seed}: expected 0 or more")
    if spec.keep_test and spec.test_size:
        raise ConfigError("--keep-test and --test-size: choose one fixed test set")


def read_labelled_manifest(path: Path) -> Any:
    """The manifest, refused when it has no labelled positive (PU labels are the input)."""
    from adni_pu.cohort import read_manifest

    frame = read_manifest(path)
    if not (frame["pu_label"] == 1).any():
        raise ManifestError(f"{path}: column pu_label: expected labelled positives (1) and "
                            "unlabelled subjects (0), found no 1 (a cohort from `adni-pu "
                            "cohort build` has them)")
    return frame


def prepare(spec: CompareSpec, wanted: list[str] | None = None) -> list[Piece]:
    """Check the inputs, record the settings and write the fold manifests; returns the
    pieces this process takes. Refuses, before any work, what cannot run."""
    from adni_pu.workflows.compare.folds import (
        absolute_scan_paths,
        check_folds,
        fold_frames,
        subject_table,
        test_subjects,
    )
    from adni_pu.workflows.run_folder import manifest_file

    check_spec(spec)
    out = fileio.check_out_dir(spec.out, "the comparison")
    pieces = select_pieces(all_pieces(spec), list(wanted or []))
    mpath = manifest_file(spec.manifest)
    frame = absolute_scan_paths(read_labelled_manifest(mpath), mpath.parent)
    if spec.holdout is not None:
        _prepare_holdout(spec, frame, mpath, out)
        return pieces
    subjects = subject_table(frame)
    test = test_subjects(subjects, spec.test_size, spec.keep_test, spec.fold_seed)
    if spec.keep_test and not test:
        raise ManifestError(f"{mpath}: column split: --keep-test expected rows with split "
                            "'test', found none")
    check_folds(subjects[~subjects["subject_id"].isin(test)], spec.folds, spec.fold_seed,
                str(mpath))
    frames, test_frame = fold_frames(frame, spec.folds, spec.fold_seed, test)
    check_priors(spec, frames, str(mpath))
    check_settings(out, {"manifest": str(mpath), "manifest_sha256": fileio.sha256_file(mpath),
                         "settings": spec.recorded()})  # the first write, after every check
    for k, part in enumerate(frames):
        _write_once(fold_manifest(out, k), part.to_csv(index=False))
    if test_frame is not None:
        _write_once(out / "folds" / TEST_MANIFEST, test_frame.to_csv(index=False))
    return pieces


def _prepare_holdout(spec: CompareSpec, frame: Any, mpath: Path, out: Path) -> None:
    """Hold-out mode's part of :func:`prepare`: each seed's split checked, then written."""
    from adni_pu.workflows.compare.folds import (
        check_holdout,
        holdout_assignment,
        holdout_frame,
        holdout_subjects,
    )

    assert spec.holdout is not None
    subjects = holdout_subjects(frame)
    check_holdout(subjects, spec.holdout, val_fraction(spec), spec.seed_values, str(mpath))
    frames = {s: holdout_frame(frame, holdout_assignment(subjects, spec.holdout,
                                                         val_fraction(spec), s))
              for s in spec.seed_values}
    check_priors(spec, list(frames.values()), str(mpath))
    check_settings(out, {"manifest": str(mpath), "manifest_sha256": fileio.sha256_file(mpath),
                         "settings": spec.recorded()})
    for seed, part in frames.items():
        _write_once(seed_manifest(out, seed), part.to_csv(index=False))


def check_priors(spec: CompareSpec, frames: list[Any], where: str) -> None:
    """Refuse, before any work, a class prior some fold cannot resolve for a method that
    reads it (as ``train`` would refuse it in that fold's piece): ``cohort`` needs a
    training subject with known truth, ``estimate`` enough validation scans
    (:func:`~adni_pu.workflows.class_prior.check_estimable_counts`)."""
    from adni_pu.workflows.class_prior import check_estimable_counts, reads_no_prior

    readers = [m for m in spec.methods
               if not reads_no_prior(method_preset(m)[0],
                                     piece_config(spec, Piece(m, 0, 0)).train.val_criterion)]
    priors = {method_prior(spec, m) for m in readers}
    for k, frame in enumerate(frames):
        split = frame["split"].astype(str)
        if "cohort" in priors and not frame.loc[split == "train", "truth"].notna().any():
            raise ConfigError(f"{where}: fold {k}: no training subject has a known truth, so "
                              f"the class prior of {', '.join(readers)} cannot come from the "
                              "cohort; give --prior a number or 'estimate'")
        if "estimate" in priors:
            val = frame[split == "val"]
            try:
                check_estimable_counts(int((val["pu_label"] == 1).sum()),
                                       int((val["pu_label"] == 0).sum()))
            except AdniPuError as exc:
                raise ConfigError(f"{where}: fold {k}: {exc}") from None


def check_settings(out: Path, record: dict[str, Any]) -> None:
    """Record the manifest's hash and the settings in ``OUT/comparison.json``; a folder
    that holds another comparison is refused (resume is keyed by the inputs)."""
    path = out / SETTINGS_FILE
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ResumeError(f"{path}: not valid JSON ({exc}); use a new folder") from None
        for key in ("manifest_sha256", "settings"):
            if old.get(key) != record[key]:
                what = "another manifest" if key == "manifest_sha256" else "other settings"
                raise ResumeError(f"{out} holds a comparison of {what} ({path}: {key} "
                                  f"differs); use a new folder, or the same inputs to resume")
        return
    _write_once(path, json.dumps(record, indent=2) + "\n")


def _write_once(path: Path, text: str) -> None:
    """Write ``path`` atomically unless it already holds ``text``."""
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fileio.atomic_write_text(path, text)


def read_piece(out: Path, piece: Piece) -> dict[str, Any] | None:
    """A finished piece's results, or None."""
    path = piece_dir(out, piece) / PIECE_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def piece_config(spec: CompareSpec, piece: Piece) -> Any:
    """The piece's training settings: the method's preset, the spec's settings file and
    ``--set`` overrides, then its prior and seed (values)."""
    from adni_pu.workflows.volume_settings import load_volume_config

    preset, own = method_preset(piece.method)
    values: dict[str, Any] = {"prior": spec.prior, **own, "train": {"seed": piece.seed}}
    return load_volume_config(spec.config_file, list(spec.overrides), preset=preset,
                              values=values)


def run_piece(spec: CompareSpec, piece: Piece, log: Any = None) -> dict[str, Any]:
    """Train one piece (resuming a cut-short one), score it and write ``piece.json``;
    a finished piece is read back. Holds the piece folder's lock throughout."""
    from adni_pu.locking import output_lock
    from adni_pu.workflows.train import train_volumes

    out = Path(spec.out)
    where = piece_dir(out, piece)
    with output_lock(where, "benchmark cohort"):
        done = read_piece(out, piece)
        if done is not None:
            return done
        cfg = piece_config(spec, piece)
        tic = time.perf_counter()
        manifest = piece_manifest(spec, piece)
        fit = train_volumes(manifest, cfg, where, log=log)
        seconds = time.perf_counter() - tic
        tic = time.perf_counter()
        info = json.loads((where / "run.json").read_text())
        held = score_split(where, manifest)
        test_path = out / "folds" / TEST_MANIFEST
        test = score_split(where, test_path) if test_path.is_file() else None
        record = {"method": piece.method, "fold": piece.fold, "seed": piece.seed,
                  "prior": info.get("prior"), "prior_estimate": info.get("prior_estimate"),
                  "selected_epoch": int(fit.best_epoch) + 1,
                  "selected_model": fit.best_candidate, "epochs": cfg.train.epochs,
                  "train_seconds": seconds, "score_seconds": time.perf_counter() - tic,
                  "splits": split_summary(manifest), "held_out": held,
                  "independent_test": test}
        fileio.atomic_write_text(where / PIECE_FILE, json.dumps(record, indent=2) + "\n")
        return record


def split_summary(manifest: Path) -> dict[str, Any]:
    """What the piece's splits ask of a PU method (:func:`adni_pu.cohort.pu_summary` of
    train, val and test): the labelled positives, class prior and hidden positives."""
    from adni_pu.cohort import pu_summary
    from adni_pu.workflows.run_folder import load_manifest

    frame = load_manifest(manifest)
    split = frame["split"].astype(str)
    return {s: pu_summary(frame[split == s]) for s in ("train", "val", "test")}


def score_split(run_dir: Path, manifest: Path) -> list[dict[str, Any]]:
    """Per subject of the manifest's ``test`` split: the selected model's mean probability
    over the subject's scans, its logit, the PU label and the truth (as ``evaluate``)."""
    import numpy as np
    import pandas as pd

    from adni_pu.cohort.ids import scans_by_subject
    from adni_pu.data.volumes import build_volume_dataset
    from adni_pu.pu.metrics import logit, sigmoid
    from adni_pu.workflows.run_folder import load_manifest, load_run, score_dataset

    cfg, model, _ = load_run(run_dir, "cpu" if cfg_device_is_cpu(run_dir) else "auto")
    frame = load_manifest(manifest)
    rows = scans_by_subject(frame[frame["split"] == "test"].reset_index(drop=True))
    dataset = build_volume_dataset(frame, "test", cfg.data, train=False,
                                   base_dir=manifest.parent)
    logits = np.asarray(score_dataset(model, dataset, max(cfg.train.batch_size, 2)), float)
    scans = pd.DataFrame({"subject_id": rows["subject_id"],
                          "pu_label": pd.to_numeric(rows["pu_label"]).astype(int),
                          "truth": pd.to_numeric(rows["truth"], errors="coerce"),
                          "probability": sigmoid(logits)})
    subjects = scans.groupby("subject_id", sort=True).agg(
        probability=("probability", "mean"), pu_label=("pu_label", "max"),
        truth=("truth", "first")).reset_index()
    subjects["logit"] = logit(subjects["probability"].to_numpy())
    return [{"subject_id": r.subject_id, "pu_label": int(r.pu_label),
             "truth": None if pd.isna(r.truth) else float(r.truth),
             "probability": float(r.probability), "logit": float(r.logit)}
            for r in subjects.itertuples()]


def cfg_device_is_cpu(run_dir: Path) -> bool:
    """Whether the run was trained with ``train.device = "cpu"`` (then it is scored there)."""
    import tomllib

    from adni_pu.workflows.run_folder import VOLUME_CONFIG_NAME

    data = tomllib.loads((run_dir / VOLUME_CONFIG_NAME).read_text())
    return data.get("train", {}).get("device") == "cpu"


def run_comparison(spec: CompareSpec, wanted: list[str] | None = None, log: Any = None
                   ) -> dict[str, Any]:
    """Check the inputs, then run this process's pieces (``wanted``: ``--piece``; all by
    default). A piece another process holds is left to it. Returns the counts and the
    wall time, for the caller's report and the overhead measurement."""
    from adni_pu.errors import OutputLockedError

    say = log or (lambda msg: None)
    tic = time.perf_counter()
    pieces = prepare(spec, wanted)
    counts = {"trained": 0, "finished_before": 0, "held_elsewhere": 0, "train_seconds": 0.0}
    for i, piece in enumerate(pieces, 1):
        if read_piece(Path(spec.out), piece) is not None:
            counts["finished_before"] += 1
            continue
        say(f"piece {i}/{len(pieces)}: {piece.name}")
        try:
            record = run_piece(spec, piece, log=log)
        except OutputLockedError as exc:
            say(f"piece {piece.name}: left to the process holding it ({exc})")
            counts["held_elsewhere"] += 1
            continue
        counts["trained"] += 1
        counts["train_seconds"] += record["train_seconds"]
    counts["pieces"] = len(pieces)
    counts["wall_seconds"] = time.perf_counter() - tic
    return counts


def _layouts() -> tuple[Any, Any]:
    """What ``benchmark cohort`` and ``benchmark cohort-report`` write into OUT."""
    from adni_pu import outputs

    report = (
        ("report.md", "the comparison's report"),
        ("report.json", "the pooled metrics, paired differences and references"),
        ("roc.png", "the held-out ROC curves"),
        ("calibration.png", "the reliability diagram (with a truth)"),
        ("records/", "one results file per method, read by `benchmark table`"),
        ("volume_features.csv", "the two measured volumes of the reference line"))
    pieces = (
        (SETTINGS_FILE, "the manifest's content hash and the settings (the record)"),
        ("folds/", "each fold's manifest (and the fixed test set's), or with --holdout "
                   "each seed's"),
        ("pieces/", "one run folder per method, fold and seed, with its piece.json"),
        ("predictions/", "raw scans preprocessed for the fold models' predictions"))
    return (outputs.layout("benchmark cohort", "OUT", SETTINGS_FILE, *pieces, *report),
            outputs.layout("benchmark cohort-report", "OUT", "report.json", *report))


#: The names ``benchmark cohort`` writes into OUT (the report's included) and those
#: ``benchmark cohort-report`` writes (:mod:`adni_pu.workflows.output_registry`).
LAYOUT, REPORT_LAYOUT = _layouts()
