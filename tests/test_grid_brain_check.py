"""Issue 52, item 6: model inputs are what they claim. The one model-grid input check also
refuses a brain mask, a cerebellum mask, a volume of one non-zero voxel and a flat brain
(brain voxels of one value), each with its reason: in predict a failed row naming the
file, in train, evaluate and interpret one line naming the file, exit 2."""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner
from volume_helpers import grid_volume, make_volume_cohort, tiny_overrides

from adni_pu import atlas
from adni_pu.cli.app import app
from adni_pu.data.grid_check import MIN_BRAIN_FRACTION, content_problem

runner = CliRunner()

BINARY = "found a binary volume: every non-zero voxel is"
TOO_FEW = f"expected a brain of at least {MIN_BRAIN_FRACTION:.0%} of the grid's voxels"


def _impostors() -> dict[str, tuple[np.ndarray, str]]:
    """Model-grid volumes that are not T1 images, each with the reason it is refused."""
    real, _ = grid_volume(3, False)
    brain = real != 0
    one = np.zeros(real.shape, np.int16)
    one[60, 72, 60] = 900
    cerebellum = atlas.region_mask(atlas.CEREBELLUM_REGIONS, atlas.model_grid_affine(),
                                   real.shape) > 0
    labels = np.where(brain, 1, 0).astype(np.uint8)
    labels[: real.shape[0] // 2][brain[: real.shape[0] // 2]] = 2  # two hemispheres
    return {
        "brain_mask": (brain.astype(np.uint8), f"{BINARY} 1 (a mask"),
        "cerebellum_mask": (cerebellum.astype(np.uint8), TOO_FEW),
        "one_voxel": (one, "found 1 non-zero voxel(s) (0.00%)"),
        "flat_brain": (np.where(brain, 500, 0).astype(np.int16), f"{BINARY} 500"),
        "label_map": (labels, "non-zero voxels of only two values (1, 2): a label map"),
    }


def test_a_real_looking_volume_passes_and_each_impostor_is_refused_with_its_reason() -> None:
    real, _ = grid_volume(3, True)
    assert content_problem(real) is None
    assert MIN_BRAIN_FRACTION * real.size < (real != 0).sum()
    for name, (data, reason) in _impostors().items():
        why = content_problem(data)
        assert why is not None and reason in why, (name, why)
    # the cerebellum mask is both too small and binary: both reasons, on one line
    why = content_problem(_impostors()["cerebellum_mask"][0])
    assert TOO_FEW in why and BINARY in why and "\n" not in why


def test_brain_of_three_values_or_a_whole_grid_of_noise_passes() -> None:
    """The check is about images, not about a texture: three intensities in a large enough
    brain pass, as does a grid with no zero voxel at all."""
    real, _ = grid_volume(5, False)
    three = np.where(real != 0, 100 + (np.arange(real.size).reshape(real.shape) % 3), 0)
    assert content_problem(three) is None
    assert content_problem(np.random.default_rng(0).normal(size=(20, 20, 20))) is None


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    """The tiny cohort, a one-epoch run on it, and the impostors saved on the grid."""
    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    root = tmp_path_factory.mktemp("brain_check")
    cohort = make_volume_cohort(root / "cohort")
    run = root / "run"
    train_volumes(cohort, load_volume_config(None, tiny_overrides(1), preset="naive"), run,
                  log=lambda m: None)
    out: dict[str, Path] = {"cohort": cohort, "run": run, "root": root}
    for name, (data, _) in _impostors().items():
        out[name] = root / f"{name}.nii.gz"
        nib.save(nib.Nifti1Image(data, atlas.model_grid_affine()), str(out[name]))
    return out


def test_predict_gives_each_impostor_a_failed_row_naming_the_file(setup) -> None:
    from adni_pu.workflows.predict import predict_scans

    good = setup["cohort"].parent / "vol" / "sub-15_ses-bl_desc-preproc_T1w.nii"
    names = list(_impostors())
    table = predict_scans(setup["run"], [setup[n] for n in names] + [good],
                          out=setup["root"] / "p.csv")
    assert list(table.status) == ["failed"] * len(names) + ["model-grid"]
    for i, name in enumerate(names):
        assert table.error[i].startswith(f"{setup[name]}: "), table.error[i]
        assert _impostors()[name][1] in table.error[i]
        assert table.prediction[i] == ""
    assert 0 < table.probability[len(names)] < 1


def _manifest_with(setup, scan: Path, split: str, name: str) -> Path:
    """The cohort's manifest (absolute paths) with one scan of ``split`` replaced by ``scan``."""
    frame = pd.read_csv(setup["cohort"], dtype=str)
    frame["scan_path"] = [str(setup["cohort"].parent / p) for p in frame["scan_path"]]
    frame.loc[frame.index[frame["split"] == split][0], "scan_path"] = str(scan)
    path = setup["root"] / f"{name}.csv"
    frame.to_csv(path, index=False)
    return path


@pytest.mark.parametrize("command", ["train", "evaluate", "interpret"])
def test_train_evaluate_interpret_refuse_a_flat_brain_in_one_line(setup, command) -> None:
    scan = setup["flat_brain"]
    split = "train" if command == "train" else "test"
    manifest = _manifest_with(setup, scan, split, f"flat-{command}")
    if command == "train":
        out = setup["root"] / "run-flat"
        args = ["train", str(manifest), str(out), "--preset", "naive"]
        args += [a for s in tiny_overrides(1) for a in ("--set", s)]
    elif command == "evaluate":
        args = ["evaluate", str(setup["run"]), "--manifest", str(manifest)]
    else:
        args = ["interpret", str(setup["run"]), "--manifest", str(manifest), "--out",
                str(setup["root"] / "int-flat"), "--sanity", "0"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    assert f"{scan}: " in errors[0] and f"{BINARY} 500" in errors[0]
    if command == "train":
        assert not (setup["root"] / "run-flat").exists()
