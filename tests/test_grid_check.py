"""The one model-grid input check (adni_pu.data.grid_check, data.integrity) in predict,
train, evaluate and interpret: broken, truncated and impostor volumes (a brain mask, a
cerebellum mask, one voxel, a flat brain, a label map) each refused with its reason,
predict's --out, and scan files whose header or name lies."""

from __future__ import annotations

import gzip
import math
import threading
from pathlib import Path
from types import SimpleNamespace

import nibabel as nib
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner
from volume_helpers import grid_volume, make_volume_cohort, tiny_overrides

from adni_pu import atlas
from adni_pu.cli.app import app
from adni_pu.data.grid_check import (
    MIN_BRAIN_FRACTION,
    check_volume_files,
    content_problem,
    header_problem,
    read_model_grid,
)
from adni_pu.data.integrity import MAX_VOXELS, volume_problem
from adni_pu.errors import ManifestError, ScanError
from adni_pu.preprocessing.io import load_scan

runner = CliRunner()


@pytest.fixture(scope="module")
def cohort(tmp_path_factory) -> Path:
    """The tiny model-grid cohort's manifest (21 volumes)."""
    return make_volume_cohort(tmp_path_factory.mktemp("inputs") / "cohort")


@pytest.fixture(scope="module")
def run(cohort: Path) -> Path:
    """A run trained for one epoch on the cohort (for predict)."""
    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    out = cohort.parent / "run"
    train_volumes(cohort, load_volume_config(None, tiny_overrides(1), preset="naive"), out,
                  log=lambda m: None)
    return out


def _grid_scan(cohort: Path, index: int = 15) -> tuple[np.ndarray, np.ndarray]:
    img = nib.load(str(cohort.parent / "vol" / f"sub-{index}_ses-bl_desc-preproc_T1w.nii"))
    return np.asarray(img.dataobj, dtype=np.float32), img.affine


def _save(path: Path, data: np.ndarray, affine: np.ndarray) -> Path:
    nib.save(nib.Nifti1Image(data, affine), str(path))
    return path


def _tiny_header_file(path: Path, shape: tuple[int, ...], compress: bool = True) -> Path:
    """A NIfTI file of a few bytes whose header claims ``shape`` of float32."""
    header = nib.Nifti1Header()
    header.set_data_shape(shape)
    header.set_data_dtype(np.float32)
    header.set_data_offset(352)  # the image would start right after the header
    body = header.binaryblock + b"\0" * 4
    path.write_bytes(gzip.compress(body) if compress else body)
    return path


# --------------------------------------------------------------------------- predict


def test_predict_fails_broken_model_grid_volumes_alone_and_scores_the_rest(
        cohort: Path, run: Path, tmp_path: Path) -> None:
    from adni_pu.workflows.predict import predict_scans

    data, affine = _grid_scan(cohort)
    good = cohort.parent / "vol" / "sub-15_ses-bl_desc-preproc_T1w.nii"
    nan = data.copy()
    nan[60, 70, 60] = np.nan
    scans = [_save(tmp_path / "nan.nii.gz", nan, affine),
             _save(tmp_path / "zero.nii.gz", np.zeros_like(data), affine),
             _save(tmp_path / "series.nii.gz", np.stack([data, data], axis=-1), affine),
             _save(tmp_path / "one4d.nii.gz", data[..., None], affine),
             good]
    table = predict_scans(run, scans, out=tmp_path / "p.csv")
    assert list(table.status) == ["failed", "failed", "failed", "model-grid", "model-grid"]
    assert "nan.nii.gz: expected finite intensities, found 1 NaN/inf voxel(s)" in table.error[0]
    assert "zero.nii.gz: expected an image, found a constant volume" in table.error[1]
    assert "series.nii.gz: is a 4D series of 2 volumes" in table.error[2]
    assert table.prediction[:3].tolist() == ["", "", ""]
    assert all(math.isnan(p) for p in table.probability[:3])
    # a 4th axis of length one is the same volume: the same probability as the 3D file
    assert 0 < table.probability[4] < 1 and table.probability[3] == table.probability[4]
    assert len(pd.read_csv(tmp_path / "p.csv")) == 5
    # the command: one line per failed scan, the others scored, exit 1 (some scans failed)
    result = runner.invoke(app, ["predict", str(run), *map(str, scans[:3]), str(good)])
    assert result.exit_code == 1, result.output
    header, *lines = result.output.strip().splitlines()
    assert header.startswith("positive class: ")  # what the probabilities are of
    assert len(lines) == 4 and "Traceback" not in result.output
    assert lines[2].startswith(f"{scans[2]}\t-\tfailed: ") and "4D series" in lines[2]
    assert lines[3].startswith(f"{good}\t0.") and "(model-grid)" in lines[3]


# --------------------------------------------------------------------------- predict --out


def test_predict_out_replaces_only_a_predictions_table(cohort: Path, run: Path,
                                                       tmp_path: Path) -> None:
    scan = cohort.parent / "vol" / "sub-16_ses-bl_desc-preproc_T1w.nii"
    summary = tmp_path / "summary.csv"
    summary.write_text("subject_id,session_id,status\nA,bl,done\n")
    other = tmp_path / "notes.csv"
    other.write_text("scan,probability\nx,0.5\n")  # two of the columns are not enough
    for target in (run / "splits.csv", cohort, summary, other):
        before = target.read_bytes()
        result = runner.invoke(app, ["predict", str(run), str(scan), "--out", str(target)])
        assert result.exit_code == 2, result.output
        assert result.output.strip().splitlines() == [
            line for line in result.output.strip().splitlines() if line.startswith("error:")]
        assert "is not a predictions table" in result.output and str(target) in result.output
        assert target.read_bytes() == before
    # a new file, then the same path again (an earlier table), and an empty file are written
    table = tmp_path / "p.csv"
    for _ in range(2):
        result = runner.invoke(app, ["predict", str(run), str(scan), "--out", str(table)])
        assert result.exit_code == 0, result.output
        assert pd.read_csv(table).shape[0] == 1
    empty = tmp_path / "empty.csv"
    empty.touch()
    assert runner.invoke(app, ["predict", str(run), str(scan), "--out", str(empty)]
                         ).exit_code == 0
    assert list(pd.read_csv(empty).columns)[:2] == ["scan", "status"]


# --------------------------------------------------------------------------- train


def _manifest_with(cohort: Path, tmp_path: Path, scan: Path, replaced: int = 3) -> Path:
    """The cohort's manifest, absolute paths, with the scan of sub-``replaced`` (by default a
    training scan) replaced by ``scan``."""
    frame = pd.read_csv(cohort, dtype=str)
    frame["scan_path"] = [str(cohort.parent / p) for p in frame["scan_path"]]
    frame.loc[frame["scan_path"].str.endswith(f"/sub-{replaced}_ses-bl_desc-preproc_T1w.nii"),
              "scan_path"] = str(scan)
    path = tmp_path / "manifest.csv"
    frame.to_csv(path, index=False)
    return path


@pytest.mark.parametrize("kind, message", [
    ("text", "cannot read as NIfTI"),
    ("folder", "is a folder; expected a NIfTI file"),
    ("nan", "expected finite intensities, found 1 NaN/inf voxel(s)"),
    ("constant-disk-cache", "found a constant volume"),
    ("series", "is a 4D series of 2 volumes"),
    ("shape", "expected a model-grid volume of shape (121, 145, 121)"),
])
def test_train_checks_every_scan_before_making_the_run_folder(
        cohort: Path, tmp_path: Path, kind: str, message: str) -> None:
    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    data, affine = _grid_scan(cohort, 3)
    scan = tmp_path / "bad.nii.gz"
    if kind == "text":
        scan = tmp_path / "passwd"
        scan.write_text("root:x:0:0:root:/root:/bin/bash\n")
    elif kind == "folder":
        scan = tmp_path / "scan.nii.gz"
        scan.mkdir()
    elif kind == "nan":
        data[50, 60, 50] = np.nan
        _save(scan, data, affine)
    elif kind == "constant-disk-cache":
        _save(scan, np.full_like(data, 7.0), affine)
    elif kind == "series":
        _save(scan, np.stack([data, data], axis=-1), affine)
    else:
        _save(scan, data[:-1], affine)
    manifest = _manifest_with(cohort, tmp_path, scan)
    overrides = tiny_overrides(1, tmp_path / "cache" if "disk" in kind else None)
    cfg = load_volume_config(None, overrides, preset="naive")
    with pytest.raises(ManifestError) as info:
        train_volumes(manifest, cfg, tmp_path / "run")
    assert str(scan) in str(info.value) and message in str(info.value)
    assert not (tmp_path / "run").exists()


def test_train_cli_says_one_line_and_exits_2(cohort: Path, tmp_path: Path) -> None:
    scan = tmp_path / "passwd"
    scan.write_text("root:x:0:0:root:/root:/bin/bash\n")
    args = ["train", str(_manifest_with(cohort, tmp_path, scan)), str(tmp_path / "run"),
            "--preset", "naive"]
    for item in tiny_overrides(1):
        args += ["--set", item]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and len(result.output.strip().splitlines()) == 1
    assert f"{scan}: cannot read as NIfTI" in result.output
    assert not (tmp_path / "run").exists()


def test_a_refused_volume_leaves_no_cache_thread_running(cohort: Path, tmp_path: Path) -> None:
    """The memory cache's worker threads are joined before the error leaves: a thread still
    inside torch when the command exits aborts the process (exit 134, not 2)."""
    from adni_pu.data.volume_config import VolumeDataConfig
    from adni_pu.data.volumes import build_volume_dataset

    data, affine = _grid_scan(cohort, 3)
    data[1, 1, 1] = np.inf
    manifest = _manifest_with(cohort, tmp_path, _save(tmp_path / "inf.nii.gz", data, affine))
    before = set(threading.enumerate())
    cfg = VolumeDataConfig(brain_size=(24, 24, 24), hipp_size=(16, 16, 16), hipp_margin=2,
                           cache_workers=2)
    with pytest.raises(ManifestError, match="inf.nii.gz: expected finite"):
        build_volume_dataset(manifest, "train", cfg)
    assert [t for t in threading.enumerate() if t not in before and t.is_alive()] == []


def test_evaluate_and_volume_features_use_the_same_check(cohort: Path, run: Path,
                                                         tmp_path: Path) -> None:
    from adni_pu.workflows.compare.references import volume_features

    data, affine = _grid_scan(cohort, 3)
    zero = _save(tmp_path / "zero.nii.gz", np.zeros_like(data), affine)
    result = runner.invoke(app, ["evaluate", str(run), "--manifest",
                                 str(_manifest_with(cohort, tmp_path, zero, replaced=16)),
                                 "--bootstrap", "0"])
    assert result.exit_code == 2, result.output
    assert f"error: {zero}: expected an image, found a constant volume" in result.output
    assert not (run / "evaluation").exists()
    with pytest.raises(ManifestError, match="zero.nii.gz: expected an image, found a constant"):
        volume_features([zero])
    assert read_model_grid(cohort.parent / "vol" / "sub-3_ses-bl_desc-preproc_T1w.nii",
                           (121, 145, 121)).shape == (121, 145, 121)


# --------------------------------------------------------------------------- scan files


def test_a_header_claiming_too_many_voxels_is_refused_before_reading(tmp_path: Path) -> None:
    huge = _tiny_header_file(tmp_path / "huge.nii.gz", (1000, 1000, 1000))
    assert huge.stat().st_size < 100
    for path in (huge, _tiny_header_file(tmp_path / "huger.nii.gz", (30000, 30000, 30000))):
        with pytest.raises(ScanError, match=r"header claims shape .* voxels\); expected at "
                                              r"most 400,000,000 voxels"):
            load_scan(path)
        assert "header claims" in header_problem(path, (121, 145, 121))
    # under the limit but far more than the file holds: refused from the size alone
    mid = _tiny_header_file(tmp_path / "mid.nii.gz", (600, 600, 600))
    with pytest.raises(ScanError, match="expected 864000352 bytes once decompressed, found "
                                        "352: truncated"):
        load_scan(mid)
    flat = _tiny_header_file(tmp_path / "flat.nii", (600, 600, 600), compress=False)
    assert "expected 864000352 bytes (header and image), found 352" in volume_problem(flat)
    assert MAX_VOXELS >= 512 * 512 * 400  # a 0.5 mm whole-head T1 is still read


def test_sizes_count_the_header_bytes(tmp_path: Path, monkeypatch) -> None:
    """The expected size is the file's data offset (352) plus the image: a loaded header's
    offset reads 0, which let a file missing its last 352 bytes pass, and made every whole
    .nii.gz look short, so each was decompressed in full to be sure."""
    import adni_pu.data.integrity as integrity

    raw = _save(tmp_path / "a.nii", np.ones((20, 22, 18), np.float32), np.eye(4))
    packed = _save(tmp_path / "b.nii.gz", np.ones((20, 22, 18), np.float32), np.eye(4))
    assert volume_problem(raw) is None
    monkeypatch.setattr(integrity.gzip, "open", None)  # a whole .nii.gz is not decompressed
    assert volume_problem(packed) is None
    raw.write_bytes(raw.read_bytes()[:-100])
    assert "expected 32032 bytes (header and image), found 31932" in volume_problem(raw)


def test_running_out_of_memory_while_reading_says_why(tmp_path: Path, monkeypatch) -> None:
    from nibabel.arrayproxy import ArrayProxy

    path = _save(tmp_path / "s.nii.gz", np.ones((20, 22, 18), np.float32), np.eye(4))

    def no_memory(self, dtype=None, copy=None):
        raise MemoryError

    monkeypatch.setattr(ArrayProxy, "__array__", no_memory)
    with pytest.raises(ScanError, match=r"s.nii.gz: not enough memory to read its "
                                        r"\(20, 22, 18\) voxels \(float32\)"):
        load_scan(path)


def test_a_misnamed_compressed_file_says_how_to_name_it(tmp_path: Path) -> None:
    data = np.random.default_rng(0).normal(100, 10, (40, 44, 36)).astype(np.float32)
    packed = _save(tmp_path / "a.nii.gz", data, np.diag([4.0, 4.0, 4.0, 1.0]))
    misnamed = tmp_path / "scan.nii"
    misnamed.write_bytes(packed.read_bytes())
    with pytest.raises(ScanError, match=r"scan.nii: holds gzip-compressed data but is not "
                                        r"named .gz; .* must be named .nii.gz"):
        load_scan(misnamed)
    assert "must be named .nii.gz" in header_problem(misnamed)
    plain = tmp_path / "plain.nii.gz"
    plain.write_bytes(gzip.decompress(packed.read_bytes()))
    with pytest.raises(ScanError, match="plain.nii.gz: is named .gz but is not gzip-compressed"):
        load_scan(plain)
    assert load_scan(packed)[0].shape == (40, 44, 36)


def test_the_header_gives_the_shape_and_affine_after_ras_reorientation() -> None:
    """What predict and the pre-flight compare with the grid, without reading the data, is
    what reorienting the data would give (a file stored PIL, as some tools write)."""
    from adni_pu.data.grid_check import canonical_affine, canonical_shape

    affine = np.array([[0, 0, -1.5, 90], [-1.5, 0, 0, 100], [0, -1.5, 0, 80], [0, 0, 0, 1.0]])
    img = nib.Nifti1Image(np.zeros((5, 6, 7), np.float32), affine)
    reoriented = nib.as_closest_canonical(img)
    assert canonical_shape(img) == reoriented.shape == (7, 5, 6)
    assert np.allclose(canonical_affine(img), reoriented.affine)
    flat = SimpleNamespace(affine=np.zeros((4, 4)), shape=(5, 6, 7))  # a zeroed header
    assert canonical_shape(flat) == (5, 6, 7)  # no orientation: the axes as stored
    assert np.array_equal(canonical_affine(flat), np.zeros((4, 4)))


def test_content_problem_names_nan_inf_and_constant_volumes() -> None:
    ok = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert content_problem(ok) is None
    bad = ok.copy()
    bad[0, 0, 0], bad[1, 1, 1] = np.nan, -np.inf
    assert content_problem(bad) == "expected finite intensities, found 2 NaN/inf voxel(s)"
    assert content_problem(np.zeros((2, 3, 4))) == ("expected an image, found a constant "
                                                    "volume (every voxel 0)")


# --------------------------------------------------------------------------- whole files


def _volume(path: Path) -> Path:
    data = np.random.default_rng(0).normal(size=(20, 24, 22)).astype(np.float32)
    nib.save(nib.Nifti1Image(data, np.eye(4)), str(path))
    return path


def test_whole_volumes_pass_and_truncated_ones_are_named(tmp_path: Path) -> None:
    raw = _volume(tmp_path / "a.nii")
    packed = _volume(tmp_path / "b.nii.gz")
    assert volume_problem(raw) is None and volume_problem(packed) is None
    # a gzip stream of several members (bgzip) has another trailer but is whole
    multi = tmp_path / "c.nii.gz"
    body = raw.read_bytes()
    multi.write_bytes(gzip.compress(body[:5000]) + gzip.compress(body[5000:]))
    assert volume_problem(multi) is None
    for path in (raw, packed):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert "truncated" in volume_problem(raw)
    assert "truncated" in volume_problem(packed)
    assert volume_problem(tmp_path / "gone.nii") == "not found"
    with pytest.raises(ManifestError, match=r"m.csv: 2 scan\(s\) cannot be used: .*a.nii: "
                                             r"expected \d+ bytes"):
        check_volume_files([raw, packed, multi], tmp_path / "m.csv")


def test_training_refuses_a_truncated_scan_before_making_the_run_folder(tmp_path: Path) -> None:
    from volume_helpers import make_volume_cohort, tiny_overrides

    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    manifest = make_volume_cohort(tmp_path / "cohort")
    scan = tmp_path / "cohort" / "vol" / "sub-3_ses-bl_desc-preproc_T1w.nii"
    scan.write_bytes(scan.read_bytes()[:100_000])
    cfg = load_volume_config(None, tiny_overrides(1), preset="naive")
    with pytest.raises(ManifestError, match="sub-3_ses-bl_desc-preproc_T1w.nii: expected"):
        train_volumes(manifest, cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- impostors
# Model inputs are what they claim: volumes on the grid that are not T1 images.

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
def setup(cohort: Path, run: Path) -> dict[str, Path]:
    """The tiny cohort, the module's one-epoch run on it, and the impostors saved on the grid."""
    root = cohort.parent / "impostors"
    root.mkdir()
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


def _manifest_with_split(setup, scan: Path, split: str, name: str) -> Path:
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
    manifest = _manifest_with_split(setup, scan, split, f"flat-{command}")
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
