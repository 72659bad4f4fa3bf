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
      scans.csv                 the train and val scans: canonical subject id, resolved file,
                                sha256 (evaluate's leakage guard, adni_pu.cohort.leakage)
      hippocampus_boxes.json    the hippocampus boxes used by the data pipeline
      preprocess_config.toml    copy of the preprocessing settings of the volumes (if found)
      val_predictions.csv       the selected model on the validation scans
      config.toml, provenance.json, data.json, metrics.csv, tensorboard/, curves.png,
      checkpoints/last.pt, best_model.pt, selection.json     (the trainer's files)
      evaluation/<split>/       written by evaluate_run
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu import config as cfgmod
from adni_pu.data.volumes import VolumeDataConfig
from adni_pu.errors import ConfigError, ResumeError, VolumeRunError
from adni_pu.fileio import atomic_write_text, check_out_dir, sha256_file
from adni_pu.locking import holding_output_lock
from adni_pu.pu.config import TrainConfig
from adni_pu.pu.metrics import sigmoid

VOLUME_CONFIG_NAME = "volume_config.toml"


# The CNN's label-channel switches and the data settings that give it those channels.
LABEL_CHANNELS: dict[str, str] = {"roi_pool": "hipp_mask", "brain_roi": "ventricle_mask"}


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
    """Class prior: a number, or "cohort" for the positive fraction (by the truth) among the
    training subjects with known truth."""
    scheme: str = "censoring"
    """PU scheme: "censoring" (U = unlabelled subjects, right for ADNI) or "case-control"."""
    bootstrap: int = cfgmod.bounded(1000, ge=0)
    """Bootstrap resamples for the CIs of ``adni-pu evaluate``."""
    train: TrainConfig = field(default_factory=_default_train)
    data: VolumeDataConfig = field(default_factory=VolumeDataConfig)

    def __post_init__(self) -> None:
        cfgmod.check_ranges(self)
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
        if self.train.model == "cnn3d":  # the network's input sizes follow the pipeline's
            args = self.train.model_args
            brain = args.get("brain_size", self.data.brain_size)
            hipp = args.get("hipp_size", self.data.hipp_size)
            if list(brain) != list(self.data.brain_size) or \
                    list(hipp) != list(self.data.hipp_size):
                raise ConfigError(
                    f"train.model_args brain_size={list(brain)}, hipp_size="
                    f"{list(hipp)} differ from data.brain_size={list(self.data.brain_size)}"
                    f", data.hipp_size={list(self.data.hipp_size)}; set only the data sizes")
            for arg, setting in LABEL_CHANNELS.items():
                given = bool(getattr(self.data, setting))
                if given and not args.get("global_pool", False):
                    raise ConfigError(f"data.{setting}=true needs train.model_args.global_pool"
                                      "=true (a branch averages its feature maps inside the "
                                      "label channel, which only the pooled head takes)")
                if bool(args.get(arg, given)) != given:
                    raise ConfigError(f"train.model_args {arg}={args[arg]} differs from "
                                      f"data.{setting}={given}; set only data.{setting} "
                                      "(the model pools inside the label it gets)")


def with_derived_values(cfg: VolumeTrainConfig) -> VolumeTrainConfig:
    """The settings with their derived values filled in (a copy; ``cfg`` is not changed).

    With ``train.model = "cnn3d"`` the network's input sizes ``train.model_args.brain_size``
    and ``hipp_size`` follow the data pipeline's ``data.brain_size`` and ``data.hipp_size``,
    and ``roi_pool`` and ``brain_roi`` follow ``data.hipp_mask`` and ``data.ventricle_mask``
    (set only those; :class:`VolumeTrainConfig`
    refuses model values that differ).
    :func:`load_volume_config` and :func:`train_volumes` call this; it is idempotent.
    """
    if cfg.train.model != "cnn3d":
        return cfg
    args = dict(cfg.train.model_args)
    args.setdefault("brain_size", list(cfg.data.brain_size))
    args.setdefault("hipp_size", list(cfg.data.hipp_size))
    for arg, setting in LABEL_CHANNELS.items():
        if getattr(cfg.data, setting):
            args.setdefault(arg, True)
    return replace(cfg, train=replace(cfg.train, model_args=args))


def load_volume_config(path: str | Path | None = None, overrides: list[str] | None = None,
                       preset: str | None = None, values: dict[str, Any] | None = None
                       ) -> VolumeTrainConfig:
    """Resolve the settings: volume defaults < preset < file < ``values`` < ``--set`` overrides.

    The preset is taken from ``preset`` (the CLI's ``--preset``), else from the overrides',
    the values' or the file's ``preset`` key, else ``selfpu``. ``values`` are settings given
    as a nested dict by library code (never as ``KEY=VALUE`` text). The class prior is
    ``prior``; ``train.prior`` is accepted as another name for it (see :func:`_one_prior`).
    Derived values are filled in last (:func:`with_derived_values`).
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
    values = dict(values or {})
    name = cfgmod.preset_choice(path, overrides, preset, "selfpu", values)
    prior_given = ("prior" in file_data or "prior" in values
                   or any(cfgmod.parse_override(o)[0] == ["prior"] for o in overrides))
    if preset is not None:
        overrides = cfgmod.without_preset(overrides)
        values["preset"] = preset
    train_defaults = cfgmod.to_dict(_default_train())
    train_defaults.pop("prior", None)
    cfgmod.deep_update(train_defaults, preset_settings(str(name)))  # unknown: ConfigError
    defaults = {"preset": name, "train": train_defaults}
    cfg = cfgmod.load(VolumeTrainConfig, path, overrides, defaults, values)
    cfg = _one_prior(cfg, prior_given, str(path) if path is not None else "settings")
    return with_derived_values(cfg)


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
    except cfgmod.ConfigError as exc:  # __post_init__ validation, said with where it came from
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
    from adni_pu.data.volumes import VolumeDataset, build_volume_dataset, check_all_items

    out: dict[str, Any] = {}
    for split in splits:
        augmented = split == "train"
        ds = build_volume_dataset(frame, split, cfg.data, train=augmented, base_dir=base)
        check_all_items(ds)  # every volume's input check before the run folder is made
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
        prior_info = {"prior": prior, "source": "cohort: positive fraction (by the truth) of the "
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


@holding_output_lock("train", "out")  # one process per run folder (adni_pu.locking)
def train_volumes(manifest: str | Path, config: VolumeTrainConfig, out: str | Path,
                  log: Any = None) -> Any:
    """Train on the manifest's train split, select on val; write the run folder ``out``.

    Rerunning with the same settings resumes from ``out/checkpoints/last.pt``. A run that
    fails before its first epoch ends leaves no run folder (when it made the folder), and
    a folder with no finished epoch is reused by any rerun (:func:`finished_work`). Under
    torchrun (``WORLD_SIZE > 1``) every process trains its share and rank 0 writes.
    Returns the trainer's :class:`~adni_pu.pu.trainer.FitResult`.
    """
    from adni_pu import distributed
    from adni_pu.cohort.leakage import check_manifest_leakage

    config = with_derived_values(config)
    from adni_pu.pu.device_data import resolve_device

    resolve_device(config.train.device, "train.device")  # no GPU: one line, before any work

    if config.train.threads > 0:
        import torch

        torch.set_num_threads(config.train.threads)
    out = check_out_dir(out, "the run folder")
    mpath = _manifest_path(manifest)
    frame = _read_manifest(mpath)
    from adni_pu.data.integrity import check_volume_files

    # every scan's header is checked here (missing, a folder, not NIfTI, truncated, not 3D,
    # not the grid) and its intensities when the datasets are built: before the run folder
    used = frame[frame["split"].isin(["train", "val"])]
    check_volume_files(_scan_paths(used, mpath.parent), mpath,
                       config.data.grid_shape if config.data.check_grid else None)
    # each subject (by canonical id) and each scan's content in one split, every pair of
    # splits: before the run folder is written
    scans = check_manifest_leakage(frame, mpath.parent, mpath)
    sha = sha256_file(mpath)
    previous = out / "run.json"
    if previous.is_file():
        old = _read_json(previous)
        done = finished_work(out)
        if done and (old.get("manifest_sha256") != sha
                     or old.get("settings") != _fingerprint(config)):
            raise ResumeError(
                f"{out} holds a run of another manifest or other settings ({done}); use a new "
                "run folder (or delete this one). A run folder with no finished epoch (no "
                "checkpoint, no best_model.pt, no row in metrics.csv) is reused by any rerun")
    run = None
    if distributed.is_distributed_env():
        from adni_pu.pu.device_data import resolve_device

        cuda = resolve_device(config.train.device).type == "cuda"
        run = distributed.init_from_env("nccl" if cuda else "gloo")
    is_main = run is None or run.rank == 0
    try:
        return _train(frame, mpath, sha, scans, config, out, run, log, previous)
    except BaseException:
        if is_main:
            remove_unfinished_run(out)
        raise


def _train(frame: Any, mpath: Path, sha: str, scans: Any, config: VolumeTrainConfig,
           out: Path, run: Any, log: Any, previous: Path) -> Any:
    """:func:`train_volumes` once its inputs are checked: write the run folder and fit."""
    import pandas as pd

    from adni_pu.cohort.leakage import RECORD_COLUMNS, RUN_RECORD
    from adni_pu.data.volumes import collate_volumes, save_hippocampus_boxes
    from adni_pu.pu.trainer import Trainer

    is_main = run is None or run.rank == 0
    data, prior_info = build_pu_data(frame, mpath.parent, config)
    trainer = Trainer(config.train, data, out, collate=collate_volumes, log=log,
                      distributed=run)
    trainer.check_resume()  # refuse other training settings before rewriting any file
    if is_main:
        out.mkdir(parents=True, exist_ok=True)
        cfgmod.save(config, out / VOLUME_CONFIG_NAME)
        save_hippocampus_boxes(config.data, out / "hippocampus_boxes.json")
        per = frame.groupby("subject_id").agg(
            split=("split", "first"), n_scans=("scan_path", "size"),
            pu_label=("pu_label", "max"), truth_known=("truth", lambda t: bool(t.notna().any())))
        atomic_write_text(out / "splits.csv", per.reset_index().to_csv(index=False))
        seen = scans[scans["split"].isin(["train", "val"])]  # for evaluate's leakage guard
        atomic_write_text(out / RUN_RECORD, seen[list(RECORD_COLUMNS)].to_csv(index=False))
        prep = _find_preprocess_config(_scan_paths(frame, mpath.parent))
        if prep is not None:
            atomic_write_text(out / "preprocess_config.toml", prep.read_text())
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


def finished_work(run_dir: Path) -> str:
    """What a run folder holds of finished training (``""`` when nothing): a checkpoint,
    a selected model or epoch rows in metrics.csv.

    A folder with none of them is the leftover of a run that failed before its first
    epoch ended; any rerun may reuse it (its files are rewritten), whatever its settings.
    """
    from adni_pu.pu.checkpoint import LAST

    found = [str(name) for name in (LAST, "best_model.pt") if (run_dir / name).exists()]
    metrics = run_dir / "metrics.csv"
    if metrics.is_file():
        with open(metrics, "rb") as handle:
            rows = sum(1 for line in handle if line.strip()) - 1
        if rows > 0:
            found.append(f"{rows} epoch row(s) in metrics.csv")
    return ", ".join(found)


def remove_unfinished_run(run_dir: Path) -> None:
    """After a failed train: remove the run folder's files when this command created the
    folder and no epoch finished, so the failure leaves nothing behind and a rerun starts
    clean. A folder that existed before the command is never removed (nor its files), and
    nor is one that holds finished work (:func:`finished_work`)."""
    import shutil

    from adni_pu.locking import LOCK_NAME, created_by_this_command

    if not run_dir.is_dir() or not created_by_this_command(run_dir) or finished_work(run_dir):
        return
    for entry in run_dir.iterdir():
        if entry.name.startswith(LOCK_NAME.removesuffix(".lock")):
            continue  # the lock's own file: released, with the empty folder, by the lock
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


# --------------------------------------------------------------------------- loading a run


def load_run(run_dir: str | Path, device: str = "auto") -> tuple[VolumeTrainConfig, Any, dict]:
    """The run's settings, its selected model (eval mode) and run.json."""
    from adni_pu.models import build_model
    from adni_pu.pu.checkpoint import load_selected, read_selected
    from adni_pu.pu.device_data import resolve_device

    run_dir = Path(run_dir)
    for name in (VOLUME_CONFIG_NAME, "best_model.pt", "run.json"):
        if not (run_dir / name).is_file():
            raise VolumeRunError(f"{run_dir}: not a finished training run ({name} missing); "
                                 "train with `adni-pu train` first")
    cfg = with_derived_values(cfgmod.load(VolumeTrainConfig, run_dir / VOLUME_CONFIG_NAME))
    saved = read_selected(run_dir / "best_model.pt")
    train_cfg = cfgmod.from_dict(TrainConfig, saved["config"])

    def factory() -> Any:
        return build_model(train_cfg.model, **train_cfg.model_args)

    model = load_selected(saved["state"], factory, resolve_device(device))
    info = _read_json(run_dir / "run.json")
    return cfg, model, info


def _read_json(path: Path) -> dict[str, Any]:
    """A run folder's JSON file, or a :class:`VolumeRunError` naming it when it is damaged."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise VolumeRunError(f"{path}: not valid JSON ({exc}); use a new run folder") from exc


def score_dataset(model: Any, dataset: Any, batch_size: int = 8) -> np.ndarray:
    """Logits of ``model`` (eval mode) for every item of a volume dataset, in order, through
    the trainer's one inference function (:meth:`DeviceData.predict_logits`)."""
    from adni_pu.data.volumes import collate_volumes
    from adni_pu.pu.device_data import DeviceData

    device = next(model.parameters()).device
    loader = DeviceData(device, batch_size=batch_size, collate=collate_volumes)
    return loader.predict_logits(model, dataset)
