"""The fold models of a comparison predict together, and a piece is a run folder.

:func:`ensemble_predict` scores scans with every finished fold model of one method (each
seed's, or one seed's) through ``predict_scans`` and reports per scan the mean probability
and its spread across the models, as nnU-Net ensembles its folds. :func:`resolve_run` turns
a comparison folder with ``--method``, ``--fold`` and ``--seed`` into the piece's run folder,
for ``evaluate`` and ``interpret``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adni_pu.errors import ConfigError
from adni_pu.workflows.compare.pieces import SETTINGS_FILE, Piece, piece_dir


def is_comparison(folder: Path) -> bool:
    """Whether ``folder`` is a comparison folder (``adni-pu benchmark cohort``)."""
    return (Path(folder) / SETTINGS_FILE).is_file()


def resolve_run(folder: Path, method: str | None, fold: int | None, seed: int | None
                ) -> Path:
    """The run folder a command acts on: ``folder`` itself (a run folder, no options), or
    the piece ``method``/``fold``/``seed`` of a comparison folder (``seed`` may be left out
    with one seed, ``fold`` in a hold-out comparison, whose one fold is each seed's split)."""
    from adni_pu.workflows.compare.report import read_spec

    folder = Path(folder)
    if not is_comparison(folder):
        if method is not None or fold is not None or seed is not None:
            raise ConfigError(f"{folder}: --fold and --seed (and the method) need a comparison "
                              f"folder of `adni-pu benchmark cohort` ({SETTINGS_FILE} missing)")
        return folder
    spec = read_spec(folder)
    if fold is None and spec.folds == 1:  # a hold-out comparison: a seed's split is its fold
        fold = 0
    if method is None or fold is None:
        raise ConfigError(f"{folder}: a comparison folder: name the piece with the method "
                          f"({', '.join(spec.methods)}) and --fold (0 to {spec.folds - 1})")
    if seed is None:
        if spec.seeds > 1:
            raise ConfigError(f"{folder}: {spec.seeds} seeds: name one with --seed "
                              f"({_seed_range(spec)})")
        seed = spec.first_seed
    checks = ((method in spec.methods, f"method {method!r}: expected one of "
               f"{', '.join(spec.methods)}"),
              (0 <= fold < spec.folds, f"--fold {fold}: expected 0 to {spec.folds - 1}"),
              (seed in spec.seed_values, f"--seed {seed}: expected {_seed_range(spec)}"))
    for ok, why in checks:
        if not ok:
            raise ConfigError(f"{folder}: {why}")
    return piece_dir(folder, Piece(method, fold, seed))


def fold_models(folder: Path, method: str, seed: int | None) -> list[Path]:
    """The run folders of ``method``'s finished pieces (one seed's, or every seed's)."""
    from adni_pu.workflows.compare.report import read_spec

    spec = read_spec(folder)
    if method not in spec.methods:
        raise ConfigError(f"{folder}: --method {method!r}: expected one of "
                          f"{', '.join(spec.methods)}")
    seeds = spec.seed_values if seed is None else (seed,)
    if seed is not None and seed not in spec.seed_values:
        raise ConfigError(f"{folder}: --seed {seed}: expected {_seed_range(spec)}")
    runs = [piece_dir(folder, Piece(method, k, s)) for s in seeds for k in range(spec.folds)]
    done = [r for r in runs if (r / "best_model.pt").is_file() and (r / "piece.json").is_file()]
    if not done:
        raise ConfigError(f"{folder}: no finished fold model of {method!r} yet")
    return done


def ensemble_predict(folder: Path, scans: list[Path], method: str, seed: int | None = None,
                     out: Path | None = None, device: str = "auto") -> Any:
    """Per scan the mean probability over ``method``'s fold models, its spread (standard
    deviation and range across the models) and how many models scored it; raw scans are
    preprocessed once, into ``OUT/predictions/preprocessed``. Written to ``out`` when
    given."""
    import numpy as np
    import pandas as pd

    from adni_pu.fileio import atomic_write_text
    from adni_pu.locking import output_lock
    from adni_pu.pu.metrics import logit
    from adni_pu.workflows.predict import check_table_out, predict_scans

    runs = fold_models(Path(folder), method, seed)
    if out is not None:
        check_table_out(Path(out), [Path(s) for s in scans])
    work = Path(folder) / "predictions" / "preprocessed"
    tables = [predict_scans(run, scans, None, work, device) for run in runs]
    first = tables[0]
    probs = np.stack([t["probability"].to_numpy(float) for t in tables])
    with np.errstate(all="ignore"):
        mean = probs.mean(axis=0)
        table = pd.DataFrame({
            "scan": first["scan"], "status": first["status"], "error": first["error"],
            "probability": mean, "logit": logit(mean),
            "spread_std": probs.std(axis=0, ddof=1) if len(runs) > 1 else 0.0,
            "spread_min": probs.min(axis=0), "spread_max": probs.max(axis=0),
            "n_models": len(runs)})
    table["prediction"] = ["" if np.isnan(p) else "positive" if p > 0.5 else "negative"
                           for p in table["probability"]]
    if out is not None:
        with output_lock(Path(out).parent, "predict"):
            check_table_out(Path(out), [Path(s) for s in scans])  # again, under the lock
            atomic_write_text(Path(out), table.to_csv(index=False))
    return table


def _seed_range(spec: Any) -> str:
    """``0 to 2``: the comparison's training seeds, as a refusal names them."""
    return f"{spec.seed_values[0]} to {spec.seed_values[-1]}"
