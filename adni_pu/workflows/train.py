"""Train, evaluate and apply the Self-PU engine (and the baselines) on MRI volumes.

The library behind ``adni-pu train``, ``adni-pu evaluate`` and ``adni-pu predict``:

- :func:`train_volumes` reads a cohort manifest (``docs/cohort.md``), builds the PU splits
  (labelled positives vs unlabelled subjects, the ``censoring`` scheme: U holds the
  unlabelled subjects only), trains with the one trainer (``adni_pu.pu.trainer``) and keeps
  a run folder in the spirit of ClinicaDL's (below).
- :func:`evaluate_run` scores the selected model on a split the run never saw, with
  bootstrap 95 % CIs that resample subjects, an ROC plot and per-scan and per-subject
  predictions; it refuses any subject of the run's training or validation split.
- :func:`predict_scans` gives per-scan probabilities for new scans; raw scans are first
  preprocessed with the settings of the preprocessing run that made the training volumes.

Run folder::

    RUN/
      volume_config.toml        resolved settings (rerun with --config RUN/volume_config.toml)
      run.json                  manifest path and sha256, prior and its source, counts, boxes
      splits.csv                subject_id, split, n_scans, pu_label, truth_known
      hippocampus_boxes.json    the hippocampus boxes used by the data pipeline
      preprocess_config.toml    copy of the preprocessing settings of the volumes (if found)
      val_predictions.csv       the selected model on the validation scans
      config.toml, provenance.json, data.json, metrics.csv, tensorboard/, curves.png,
      checkpoints/last.pt, best_model.pt, selection.json     (the trainer's files)
      evaluation/<split>/       written by evaluate_run
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu import config as cfgmod
from adni_pu.data.volumes import VolumeDataConfig
from adni_pu.errors import ConfigError, VolumeRunError
from adni_pu.fileio import atomic_write_text, sha256_file
from adni_pu.pu.config import TrainConfig
from adni_pu.pu.metrics import logit, sigmoid

VOLUME_CONFIG_NAME = "volume_config.toml"
METRICS = ("accuracy", "balanced_accuracy", "auc", "sensitivity", "specificity")


def _default_train() -> TrainConfig:
    return TrainConfig(model="cnn3d", model_args={"preset": "paper"}, batch_size=16,
                       eval_batch_size=16, epochs=60)


@dataclass
class VolumeTrainConfig:
    """Settings of a training run on volumes.

    ``train`` is the trainer's :class:`TrainConfig` (the ``preset`` is applied to it first,
    then the file and ``--set`` overrides); ``data`` the MONAI pipeline's settings.
    """

    preset: str = "selfpu"
    """Training preset (``adni-pu presets``): naive, upu, nnpu, selfpu or an ablation row."""
    prior: float | str = "cohort"
    """Class prior: a number, or "cohort" for the amyloid-positive fraction among the
    training subjects with known truth."""
    scheme: str = "censoring"
    """PU scheme: "censoring" (U = unlabelled subjects, right for ADNI) or "case-control"."""
    bootstrap: int = 1000
    """Bootstrap resamples for the CIs of ``adni-pu evaluate``."""
    train: TrainConfig = field(default_factory=_default_train)
    data: VolumeDataConfig = field(default_factory=VolumeDataConfig)

    def __post_init__(self) -> None:
        if isinstance(self.prior, str) and self.prior != "cohort":
            raise ConfigError(f"prior: expected a number in (0, 1) or 'cohort', found "
                             f"{self.prior!r}")
        if not isinstance(self.prior, str) and not 0.0 < float(self.prior) < 1.0:
            raise ConfigError(f"prior: expected a number in (0, 1), found {self.prior}")
        if self.scheme not in ("censoring", "case-control"):
            raise ConfigError(f"scheme: expected 'censoring' or 'case-control', found "
                             f"{self.scheme!r}")
        if self.train.model != "cnn3d" and not self.train.model_args:
            raise ConfigError(f"train.model={self.train.model!r}: volumes need 'cnn3d' (or a "
                             "model taking the brain/hipp_l/hipp_r dict, with model_args)")
        if self.bootstrap < 0:
            raise ConfigError(f"bootstrap: expected >= 0, found {self.bootstrap}")
        if self.train.model == "cnn3d":  # the network's input sizes follow the pipeline's
            args = self.train.model_args
            args.setdefault("brain_size", list(self.data.brain_size))
            args.setdefault("hipp_size", list(self.data.hipp_size))
            if list(args["brain_size"]) != list(self.data.brain_size) or \
                    list(args["hipp_size"]) != list(self.data.hipp_size):
                raise ConfigError(
                    f"train.model_args brain_size={args['brain_size']}, hipp_size="
                    f"{args['hipp_size']} differ from data.brain_size={list(self.data.brain_size)}"
                    f", data.hipp_size={list(self.data.hipp_size)}; set only the data sizes")


def load_volume_config(path: str | Path | None = None, overrides: list[str] | None = None,
                       preset: str | None = None) -> VolumeTrainConfig:
    """Resolve the settings: volume defaults < preset < file < ``--set`` overrides.

    The preset is taken from ``preset`` (the CLI's ``--preset``), else from the file's or
    the overrides' ``preset`` key, else ``selfpu``. The class prior is ``prior``;
    ``train.prior`` is accepted as another name for it (see :func:`_one_prior`).
    """
    import tomllib

    from adni_pu.pu.config import preset_settings

    file_data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise cfgmod.ConfigError(f"{path}: settings file not found")
        try:
            file_data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise cfgmod.ConfigError(f"{path}: not valid TOML ({exc})") from exc
    overrides = list(overrides or [])
    name = file_data.get("preset", "selfpu")
    prior_given = "prior" in file_data
    for text in overrides:
        keys, value = cfgmod.parse_override(text)
        if keys == ["preset"]:
            name = value
        prior_given = prior_given or keys == ["prior"]
    if preset is not None:
        name = preset
        overrides.append(f'preset="{preset}"')
    try:
        train_defaults = cfgmod.to_dict(_default_train())
        train_defaults.pop("prior", None)
        cfgmod.deep_update(train_defaults, preset_settings(str(name)))
    except ValueError as exc:
        raise cfgmod.ConfigError(str(exc)) from exc
    defaults = {"preset": name, "train": train_defaults}
    cfg = cfgmod.load(VolumeTrainConfig, path, overrides, defaults)
    return _one_prior(cfg, prior_given, str(path) if path is not None else "settings")


def _one_prior(cfg: VolumeTrainConfig, prior_given: bool, where: str) -> VolumeTrainConfig:
    """Fold ``train.prior`` into ``prior``, so one value is recorded, used and reported.

    The trainer would take ``train.prior`` for its risks while the run folder, the
    unlabelled prior and the report follow ``prior``; both given with different values
    is refused, one alone sets ``prior`` and leaves ``train.prior`` unset.
    """
    alias = cfg.train.prior
    if alias is None:
        return cfg
    if prior_given and cfg.prior != alias:
        raise cfgmod.ConfigError(
            f"{where}: prior = {cfg.prior!r} and train.prior = {alias!r} disagree; set the "
            "class prior once, as prior = <number> (or \"cohort\")")
    try:
        return replace(cfg, prior=alias, train=replace(cfg.train, prior=None))
    except ValueError as exc:
        raise cfgmod.ConfigError(f"{where}: {exc}") from exc


# --------------------------------------------------------------------------- manifest



def _manifest_path(manifest: str | Path) -> Path:
    path = Path(manifest)
    if path.is_dir():
        for name in ("manifest.parquet", "manifest.csv"):
            if (path / name).is_file():
                return (path / name).resolve()
        raise VolumeRunError(f"{path}: no manifest.csv or manifest.parquet in this folder")
    if not path.is_file():
        raise VolumeRunError(f"manifest {path} not found")
    return path.resolve()


def _read_manifest(path: Path):
    from adni_pu.cohort import read_manifest

    frame = read_manifest(path)
    if "session_id" not in frame.columns:
        frame["session_id"] = ""
    frame["subject_id"] = frame["subject_id"].astype(str)
    frame["session_id"] = frame["session_id"].fillna("").astype(str)
    frame["split"] = frame["split"].astype(str)
    return frame


def cohort_prior(manifest: Any) -> tuple[float, int, int]:
    """Amyloid-positive fraction among training subjects with known truth.

    Returns (prior, subjects with truth, subjects without truth) of the ``train`` split.
    """
    import pandas as pd

    train = manifest[manifest["split"] == "train"]
    per_subject = train.groupby("subject_id")["truth"].first()
    known = per_subject.dropna()
    n_unknown = int(per_subject.isna().sum())
    if known.empty:
        raise VolumeRunError("no training subject has a known truth, so the class prior "
                             "cannot come from the cohort; set it with --set prior=0.5")
    prior = float(pd.to_numeric(known).mean())
    return prior, int(len(known)), n_unknown


def _find_preprocess_config(scan_paths: list[Path]) -> Path | None:
    """The preprocess_config.toml of the preprocessing run that wrote these volumes."""
    for scan in scan_paths[:20]:
        for parent in list(scan.parents)[:4]:
            candidate = parent / "preprocess_config.toml"
            if candidate.is_file():
                return candidate
    return None


def _scan_paths(frame: Any, base: Path) -> list[Path]:
    out = []
    for value in frame["scan_path"].astype(str):
        p = Path(value)
        out.append(p if p.is_absolute() else base / p)
    return out


# --------------------------------------------------------------------------- datasets


def _datasets(frame: Any, base: Path, cfg: VolumeTrainConfig, splits: tuple[str, ...]
              ) -> dict[str, Any]:
    from adni_pu.data.volumes import VolumeDataset, build_volume_dataset

    out: dict[str, Any] = {}
    for split in splits:
        augmented = split == "train"
        ds = build_volume_dataset(frame, split, cfg.data, train=augmented, base_dir=base)
        out[split] = ds
        if augmented:  # the same cached items, without augmentation, for scoring
            out["train_eval"] = VolumeDataset(ds.base, ds.frame, cfg.data, train=False)
    return out


def _split_arrays(frame: Any, split: str) -> tuple[np.ndarray, np.ndarray]:
    import pandas as pd

    rows = frame[frame["split"] == split].reset_index(drop=True)
    truth = pd.to_numeric(rows["truth"], errors="coerce").astype(float).to_numpy()
    labelled = pd.to_numeric(rows["pu_label"], errors="coerce").fillna(0).to_numpy() == 1
    return truth, labelled


def build_pu_data(frame: Any, base: Path, cfg: VolumeTrainConfig) -> tuple[Any, dict[str, Any]]:
    """PUData of the manifest's train and val splits (the test split is not loaded).

    Returns the data and a dict describing the prior (value, source, counts).
    """
    from adni_pu.data.pu import PUConstructionError, PUData, PUSplit, unlabelled_prior

    present = set(frame["split"])
    for split in ("train", "val"):
        if split not in present:
            raise VolumeRunError(f"manifest has no {split!r} rows; splits found: "
                                 f"{sorted(present)}")
    prior_info: dict[str, Any] = {}
    if cfg.prior == "cohort":
        prior, n_known, n_unknown = cohort_prior(frame)
        prior_info = {"prior": prior, "source": "cohort: amyloid-positive fraction of the "
                      "training subjects with known truth", "subjects_with_truth": n_known,
                      "subjects_without_truth": n_unknown}
    else:
        prior = float(cfg.prior)
        prior_info = {"prior": prior, "source": "setting"}
    if not 0.0 < prior < 1.0:
        raise VolumeRunError(f"class prior {prior:.3f} from the cohort: expected a value in "
                             "(0, 1); set it with --set prior=...")
    truth, labelled = _split_arrays(frame, "train")
    truth_v, labelled_v = _split_arrays(frame, "val")
    if cfg.scheme == "censoring":
        try:
            unlabelled_prior(prior, len(truth), int(labelled.sum()), "censoring")
        except PUConstructionError as exc:
            raise VolumeRunError(
                f"{exc}. The class prior must exceed the labelled fraction of the training "
                f"scans ({labelled.mean():.3f}); set it with --set prior=...") from exc
    ds = _datasets(frame, base, cfg, ("train", "val"))
    train = PUSplit(ds["train"], truth, labelled, "train", eval_x=ds["train_eval"])
    val = PUSplit(ds["val"], truth_v, labelled_v, "val")
    info = {"n_train": len(train), "n_val": len(val), "n_labelled_train": int(labelled.sum()),
            "n_labelled_val": int(labelled_v.sum()), "prior": prior, "scheme": cfg.scheme,
            "test_loaded": False}
    try:
        # The test split is never read while training: the validation split stands in.
        data = PUData(train, val, val, prior, cfg.scheme, "volumes", info)  # type: ignore[arg-type]
    except PUConstructionError as exc:
        raise VolumeRunError(str(exc)) from exc
    return data, prior_info


# --------------------------------------------------------------------------- training


def _fingerprint(cfg: VolumeTrainConfig) -> dict[str, Any]:
    data = cfgmod.to_dict(cfg)
    for key in ("cache", "cache_dir", "cache_workers"):
        data["data"].pop(key, None)
    data.pop("bootstrap", None)
    data.pop("train", None)  # the trainer checks its own settings when resuming
    return data


def train_volumes(manifest: str | Path, config: VolumeTrainConfig, out: str | Path,
                  log: Any = None) -> Any:
    """Train on the manifest's train split, select on val; write the run folder ``out``.

    Rerunning with the same settings resumes from ``out/checkpoints/last.pt``. Under
    torchrun (``WORLD_SIZE > 1``) every process trains its share and rank 0 writes.
    Returns the trainer's :class:`~adni_pu.pu.trainer.FitResult`.
    """
    import pandas as pd

    from adni_pu import distributed
    from adni_pu.cohort import check_manifest_splits
    from adni_pu.data.volumes import collate_volumes, save_hippocampus_boxes
    from adni_pu.pu.trainer import ResumeError, Trainer

    if config.train.threads > 0:
        import torch

        torch.set_num_threads(config.train.threads)
    out = Path(out)
    mpath = _manifest_path(manifest)
    frame = _read_manifest(mpath)
    check_manifest_splits(frame)
    sha = sha256_file(mpath)
    previous = out / "run.json"
    if previous.is_file():
        old = json.loads(previous.read_text())
        if old.get("manifest_sha256") != sha or old.get("settings") != _fingerprint(config):
            raise ResumeError(f"{out} holds a run of another manifest or other settings; use "
                              "a new run folder (or delete this one)")
    run = None
    if distributed.is_distributed_env():
        from adni_pu.pu.trainer import resolve_device

        cuda = resolve_device(config.train.device).type == "cuda"
        run = distributed.init_from_env("nccl" if cuda else "gloo")
    is_main = run is None or run.rank == 0
    data, prior_info = build_pu_data(frame, mpath.parent, config)
    trainer = Trainer(config.train, data, out, collate=collate_volumes, log=log)
    if run is not None:
        distributed.attach(trainer, run)
    trainer.check_resume()  # refuse other training settings before rewriting any file
    if is_main:
        out.mkdir(parents=True, exist_ok=True)
        cfgmod.save(config, out / VOLUME_CONFIG_NAME)
        save_hippocampus_boxes(config.data, out / "hippocampus_boxes.json")
        per = frame.groupby("subject_id").agg(
            split=("split", "first"), n_scans=("scan_path", "size"),
            pu_label=("pu_label", "max"), truth_known=("truth", lambda t: bool(t.notna().any())))
        per.reset_index().to_csv(out / "splits.csv", index=False)
        prep = _find_preprocess_config(_scan_paths(frame, mpath.parent))
        if prep is not None:
            shutil.copyfile(prep, out / "preprocess_config.toml")
        info = {"manifest": str(mpath), "manifest_sha256": sha, "preset": config.preset,
                "prior": prior_info, "settings": _fingerprint(config),
                "preprocess_config": str(prep) if prep is not None else None,
                "counts": {s: {"subjects": int(frame.loc[frame["split"] == s, "subject_id"]
                                              .nunique()),
                               "scans": int((frame["split"] == s).sum())}
                           for s in sorted(set(frame["split"]))}}
        atomic_write_text(previous, json.dumps(info, indent=2) + "\n")
    fit = trainer.fit()
    if is_main:
        model = trainer.best_model()
        logits = trainer.predict_logits(model, data.val)  # type: ignore[arg-type]
        rows = frame[frame["split"] == "val"].reset_index(drop=True)
        preds = pd.DataFrame({
            "subject_id": rows["subject_id"], "session_id": rows["session_id"],
            "scan_path": rows["scan_path"], "pu_label": rows["pu_label"],
            "truth": rows["truth"], "logit": logits,
            "probability": sigmoid(np.asarray(logits, dtype=np.float64)),
        })
        atomic_write_text(out / "val_predictions.csv", preds.to_csv(index=False))
    if run is not None:
        run.barrier()
    return fit



# --------------------------------------------------------------------------- loading a run


def load_run(run_dir: str | Path, device: str = "auto") -> tuple[VolumeTrainConfig, Any, dict]:
    """The run's settings, its selected model (eval mode) and run.json."""
    import torch

    from adni_pu.models import build_model
    from adni_pu.pu.trainer import load_selected, resolve_device

    run_dir = Path(run_dir)
    for name in (VOLUME_CONFIG_NAME, "best_model.pt", "run.json"):
        if not (run_dir / name).is_file():
            raise VolumeRunError(f"{run_dir}: not a finished training run ({name} missing); "
                                 "train with `adni-pu train` first")
    cfg = cfgmod.load(VolumeTrainConfig, run_dir / VOLUME_CONFIG_NAME)
    saved = torch.load(run_dir / "best_model.pt", map_location="cpu", weights_only=False)
    train_cfg = cfgmod.from_dict(TrainConfig, saved["config"])

    def factory() -> Any:
        return build_model(train_cfg.model, **train_cfg.model_args)

    model = load_selected(saved["state"], factory, resolve_device(device))
    info = json.loads((run_dir / "run.json").read_text())
    return cfg, model, info


def score_dataset(model: Any, dataset: Any, batch_size: int = 8) -> np.ndarray:
    """Logits of ``model`` (eval mode) for every item of a volume dataset."""
    import torch

    from adni_pu.data.volumes import collate_volumes
    from adni_pu.pu.trainer import to_device

    device = next(model.parameters()).device
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False,
                                         collate_fn=collate_volumes)
    out = []
    model.eval()
    with torch.no_grad():
        for batch in loader:
            x = {k: batch[k] for k in ("brain", "hipp_l", "hipp_r")}
            out.append(model(to_device(x, device)).float().cpu())
    return torch.cat(out).numpy() if out else np.zeros(0, np.float32)


# --------------------------------------------------------------------------- evaluation


def evaluate_run(run_dir: str | Path, split: str = "test", manifest: str | Path | None = None,
                 device: str = "auto", n_boot: int | None = None) -> dict[str, Any]:
    """Metrics of the run's selected model on ``split`` with subject-bootstrap 95 % CIs.

    ``manifest`` defaults to the one the run was trained on. Refuses (``LeakageError``)
    when a subject of the split was in the run's training split or in its validation split
    (which chose the model, so metrics on it would be optimistic: ``--split val`` of the
    training manifest is always refused; RUN/val_predictions.csv holds those). Writes
    ``RUN/evaluation/<split>/`` (metrics.json, predictions_scans.csv,
    predictions_subjects.csv, roc.png, report.md) and returns the metrics dict.
    """
    import pandas as pd

    from adni_pu.cohort import assert_no_leakage
    from adni_pu.data.volumes import build_volume_dataset
    from adni_pu.pu.metrics import bootstrap_ci

    run_dir = Path(run_dir)
    cfg, model, info = load_run(run_dir, device)
    mpath = _manifest_path(manifest if manifest is not None else info["manifest"])
    sha = sha256_file(mpath)
    frame = _read_manifest(mpath)
    rows = frame[frame["split"] == split].reset_index(drop=True)
    if rows.empty:
        raise VolumeRunError(f"{mpath}: no rows in split {split!r}; splits found: "
                             f"{sorted(set(frame['split']))}")
    splits = pd.read_csv(run_dir / "splits.csv", dtype={"subject_id": str})
    for used, seen_in, advice in (
            ("train", "the run's training split", "Evaluate on subjects the run never saw "
             "(splits must be by subject)."),
            ("val", "the run's validation split, which chose the model (model selection)",
             "Metrics on them would not be an honest estimate; the selected model's "
             f"validation predictions are in {run_dir / 'val_predictions.csv'}.")):
        assert_no_leakage(splits.loc[splits["split"] == used, "subject_id"], rows["subject_id"],
                          what=f"{split!r}", seen_in=seen_in, advice=advice)
    dataset = build_volume_dataset(frame, split, cfg.data, train=False, base_dir=mpath.parent)
    logits = score_dataset(model, dataset, max(cfg.train.batch_size, 2))
    truth = pd.to_numeric(rows["truth"], errors="coerce").astype(float).to_numpy()
    scans = pd.DataFrame({"subject_id": rows["subject_id"], "session_id": rows["session_id"],
                          "scan_path": rows["scan_path"], "truth": truth, "logit": logits,
                          "probability": sigmoid(np.asarray(logits, dtype=np.float64))})
    subjects = scans.groupby("subject_id", sort=True).agg(
        n_scans=("probability", "size"), probability=("probability", "mean"),
        truth=("truth", "first")).reset_index()
    subjects["logit"] = logit(subjects["probability"])
    boots = cfg.bootstrap if n_boot is None else n_boot
    known_sub = subjects["truth"].notna()
    result: dict[str, Any] = {
        "run": str(run_dir), "split": split, "manifest": str(mpath),
        "manifest_is_training_manifest": sha == info.get("manifest_sha256"),
        "n_scans": len(scans), "n_subjects": len(subjects),
        "n_scans_scored": int(scans["truth"].notna().sum()),
        "n_subjects_scored": int(known_sub.sum()),
        "n_subjects_unknown_truth": int((~known_sub).sum()),
        "n_scans_unknown_truth": int(scans["truth"].isna().sum()),
        "bootstrap": {"resamples": boots, "level": 0.95, "unit": "subject"},
        "scan_level": bootstrap_ci(scans["logit"].to_numpy(), truth, METRICS, n_boot=boots,
                                   groups=scans["subject_id"].to_numpy()),
        "subject_level": bootstrap_ci(subjects["logit"].to_numpy(),
                                      subjects["truth"].to_numpy(), METRICS, n_boot=boots),
    }
    out = run_dir / "evaluation" / split
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "predictions_scans.csv", scans.to_csv(index=False))
    atomic_write_text(out / "predictions_subjects.csv", subjects.to_csv(index=False))
    roc_plot(scans["logit"].to_numpy(), truth, out / "roc.png",
             title=f"{run_dir.name}: {split} ({result['n_scans_scored']} scans)",
             auc=result["scan_level"]["auc"])
    result["files"] = {k: str(out / v) for k, v in (
        ("metrics", "metrics.json"), ("predictions_scans", "predictions_scans.csv"),
        ("predictions_subjects", "predictions_subjects.csv"), ("roc", "roc.png"),
        ("report", "report.md"))}
    atomic_write_text(out / "metrics.json", json.dumps(_jsonable(result), indent=2) + "\n")
    atomic_write_text(out / "report.md", metrics_markdown(result))
    return result


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, (np.floating, np.integer)):
        return _jsonable(obj.item())
    return obj


def format_ci(entry: dict[str, float]) -> str:
    """``0.812 [0.701, 0.903]`` (``n/a`` where undefined)."""
    def f(v: float | None) -> str:
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"

    return f"{f(entry['value'])} [{f(entry['ci_low'])}, {f(entry['ci_high'])}]"


def metrics_markdown(result: dict[str, Any]) -> str:
    """A short Markdown report of one evaluation."""
    lines = [f"# Evaluation of {result['run']} on split `{result['split']}`", "",
             f"Manifest: `{result['manifest']}`"
             + ("" if result["manifest_is_training_manifest"] else " (not the training manifest)"),
             "",
             f"{result['n_subjects']} subjects, {result['n_scans']} scans; "
             f"{result['n_subjects_unknown_truth']} subject(s) "
             f"({result['n_scans_unknown_truth']} scans) left out for unknown truth.", "",
             "95 % CIs: percentile bootstrap over subjects "
             f"({result['bootstrap']['resamples']} resamples).", "",
             "| metric | per scan | per subject (mean probability) |", "|---|---|---|"]
    for m in METRICS:
        lines.append(f"| {m.replace('_', ' ')} | {format_ci(result['scan_level'][m])} | "
                     f"{format_ci(result['subject_level'][m])} |")
    lines += ["", "![ROC](roc.png)", ""]
    return "\n".join(lines)


def roc_curve(scores: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """False- and true-positive rates at every threshold (unknown truth left out)."""
    scores = np.asarray(scores, dtype=float)
    truth = np.asarray(truth, dtype=float)
    keep = ~np.isnan(truth)
    scores, y = scores[keep], truth[keep].astype(bool)
    order = np.argsort(-scores, kind="stable")
    scores, y = scores[order], y[order]
    distinct = np.r_[np.flatnonzero(np.diff(scores)), len(y) - 1] if len(y) else np.array([], int)
    tps = np.cumsum(y)[distinct] if len(y) else np.zeros(0)
    fps = (distinct + 1 - tps) if len(y) else np.zeros(0)
    n_pos, n_neg = max(int(y.sum()), 1), max(int((~y).sum()), 1)
    return np.r_[0.0, fps / n_neg], np.r_[0.0, tps / n_pos]


def roc_plot(scores: np.ndarray, truth: np.ndarray, path: Path, title: str = "",
             auc: dict[str, float] | None = None, curves: dict[str, tuple] | None = None) -> Path:
    """Save an ROC plot (one curve, or several named ``(scores, truth)`` pairs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    for name, (s, t) in (curves or {"model": (scores, truth)}).items():
        fpr, tpr = roc_curve(s, t)
        label = name
        if curves is None and auc is not None:
            label = f"AUC {format_ci(auc)}"
        ax.plot(fpr, tpr, lw=1.8, label=label)
    ax.plot([0, 1], [0, 1], ls="--", c="grey", lw=0.8)
    ax.set(xlabel="1 - specificity", ylabel="sensitivity", xlim=(-0.01, 1.01),
           ylim=(-0.01, 1.01), title=title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- prediction


def on_model_grid(path: str | Path, data: VolumeDataConfig) -> bool:
    """Whether a NIfTI file is already on the model grid (shape and affine, after RAS)."""
    import nibabel as nib

    img = nib.as_closest_canonical(nib.load(str(path)))
    if tuple(img.shape[:3]) != tuple(data.grid_shape):
        return False
    expected = data.grid_affine()
    return bool(np.allclose(img.affine, expected, atol=1e-3 * abs(expected[0, 0]) + 1e-4))


def preprocess_folder(work: Path, scan: Path) -> Path:
    """Where ``predict`` preprocesses ``scan``: one folder per input file.

    Named after the file and a hash of its resolved path, so two different scans with the
    same file name (``a/T1.nii.gz``, ``b/T1.nii.gz``) never share, and overwrite, outputs.
    """
    resolved = str(Path(scan).resolve())
    digest = hashlib.sha256(resolved.encode()).hexdigest()[:12]
    name = "".join(c for c in Path(resolved).name.split(".")[0] if c.isalnum())[:40]
    return work / f"{name or 'scan'}-{digest}"


def _preprocess_raw(paths: list[Path], work: Path, prep_cfg: Any) -> dict[Path, dict]:
    """Preprocess raw scans, each in its own folder, in one spawned single-threaded worker.

    The same rule as ``adni-pu preprocess``: one ITK/ANTs/torch thread in a fresh process
    (ITK reads its thread count once per process) and the recorded registration seed, so
    the same scan always gives the same model input and probability. Returns the summary
    row of each resolved path.
    """
    from adni_pu.preprocessing import Scan
    from adni_pu.preprocessing.io import discover_scans
    from adni_pu.preprocessing.runner import run_in_workers

    jobs = []
    done: dict[Path, dict] = {}
    for path in dict.fromkeys(p.resolve() for p in paths):
        try:
            found = discover_scans([path])[0]
        except Exception as exc:  # noqa: BLE001 - an unusable name fails this scan only
            done[path] = {"status": "failed", "error": " ".join(str(exc).split())}
            continue
        jobs.append((Scan(found.subject_id, found.session_id, path),
                     preprocess_folder(work, path)))
    run_in_workers(jobs, prep_cfg, workers=1, threads=1,
                   collect=lambda row: done.__setitem__(Path(row["input_path"]), row))
    return done


def predict_scans(run_dir: str | Path, scans: list[str | Path], out: str | Path | None = None,
                  work_dir: str | Path | None = None, device: str = "auto") -> Any:
    """Per-scan probabilities of amyloid positivity from the run's selected model.

    Files already on the model grid are used as they are. Other (raw) scans are first
    preprocessed, each into its own folder under ``work_dir`` (default
    ``RUN/predictions/preprocessed``), with the settings recorded by the preprocessing run
    that made the training volumes (``RUN/preprocess_config.toml``) and one thread, so
    reruns give identical probabilities; without those settings raw scans are refused.
    A missing or unreadable scan fails its own row (the reason in ``error``); when no scan
    is usable the whole call is refused. Returns a DataFrame (one row per input: ``scan,
    status, model_input, probability, logit, prediction, error``) and writes it to
    ``out`` when given.
    """
    import pandas as pd

    from adni_pu.data.volumes import build_volume_dataset

    run_dir = Path(run_dir)
    cfg, model, _ = load_run(run_dir, device)
    paths = [Path(s) for s in scans]
    if not paths:
        raise VolumeRunError("no scan given")
    rows: list[dict[str, Any]] = []
    raw: list[int] = []
    for i, p in enumerate(paths):
        if not p.exists():
            rows.append({"scan": str(p), "status": "failed", "model_input": "",
                         "error": f"{p}: not found"})
            continue
        try:
            ready = p.is_file() and on_model_grid(p, cfg.data)
        except Exception as exc:  # noqa: BLE001 - an unreadable file is that scan's failure
            rows.append({"scan": str(p), "status": "failed", "model_input": "",
                         "error": " ".join(f"{p}: cannot read: {exc}".split())})
            continue
        rows.append({"scan": str(p), "status": "model-grid" if ready else "raw",
                     "model_input": str(p) if ready else "", "error": ""})
        if not ready:
            raw.append(i)
    if all(r["status"] == "failed" for r in rows):
        raise VolumeRunError("no usable scan: " + "; ".join(r["error"] for r in rows))
    if raw:
        prep_cfg_path = run_dir / "preprocess_config.toml"
        if not prep_cfg_path.is_file():
            names = ", ".join(rows[i]["scan"] for i in raw)
            raise VolumeRunError(
                f"{names}: not on the model grid, and the run has no recorded preprocessing "
                f"settings ({prep_cfg_path} missing: its volumes did not come from "
                "`adni-pu preprocess`). Preprocess the scans with the settings used for the "
                "training volumes and pass the *_T1w_preproc.nii.gz files.")
        from adni_pu.preprocessing import load_config

        prep_cfg = load_config(prep_cfg_path)
        work = Path(work_dir) if work_dir is not None else run_dir / "predictions" / "preprocessed"
        done = _preprocess_raw([paths[i] for i in raw], work, prep_cfg)
        for i in raw:
            row = done[paths[i].resolve()]
            if row["status"] in ("done", "skipped"):
                rows[i].update(status="preprocessed", model_input=row["preprocessed_path"])
            else:
                rows[i].update(status=row["status"], error=row["error"])
    usable = [i for i, r in enumerate(rows) if r["model_input"]]
    for r in rows:
        r.update(probability=float("nan"), logit=float("nan"), prediction="")
    if usable:
        frame = pd.DataFrame({
            "subject_id": [f"scan{i}" for i in usable], "session_id": "",
            "scan_path": [rows[i]["model_input"] for i in usable], "pu_label": 0,
            "truth": float("nan"), "split": "predict"})
        dataset = build_volume_dataset(frame, "predict", cfg.data, train=False)
        # one scan a batch: a scan's probability must not depend on the other scans given
        # (batched CPU convolutions differ in the last digits with the batch's make-up)
        logits = score_dataset(model, dataset, 1)
        for i, lg in zip(usable, logits):
            prob = float(sigmoid(np.asarray(lg, dtype=np.float64)))
            rows[i].update(probability=prob, logit=float(lg),
                           prediction="amyloid-positive" if prob > 0.5 else "amyloid-negative")
    table = pd.DataFrame(rows, columns=["scan", "status", "model_input", "probability",
                                        "logit", "prediction", "error"])
    if out is not None:
        atomic_write_text(out, table.to_csv(index=False))
    return table
