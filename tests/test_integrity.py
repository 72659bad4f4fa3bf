"""Nothing half-read, nothing half-written: truncated volumes, read-only outputs, one-line
errors (issue 25)."""

from __future__ import annotations

import errno
import gzip
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.data.grid_check import check_volume_files
from adni_pu.data.integrity import volume_problem
from adni_pu.errors import ManifestError, OutputError
from adni_pu.fileio import check_out_dir

runner = CliRunner()


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


def test_a_read_only_output_folder_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch) -> None:
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(OutputError, match=r"new/run: cannot write there \(in .*\): "
                                          r"Permission denied"):
        check_out_dir(tmp_path / "new" / "run", "the run folder")
    assert not (tmp_path / "new").exists()


def test_the_cli_turns_a_refused_path_into_one_line(tmp_path: Path, monkeypatch) -> None:
    import adni_pu.workflows.evaluate as ev

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "report.md"))

    monkeypatch.setattr(ev, "evaluate_run", refused)
    result = runner.invoke(app, ["evaluate", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {tmp_path / 'report.md'}: Permission denied"


def test_benchmark_with_no_seeds_is_a_one_line_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["benchmark", "mnist", "--seeds", "0", "--data-dir",
                                 str(tmp_path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        "error: --seeds: expected at least 1 seed, found 0"]


def test_a_bad_set_value_is_blamed_on_the_set_not_on_the_settings_file(tmp_path: Path) -> None:
    from adni_pu.errors import ConfigError
    from adni_pu.workflows.volume_settings import load_volume_config

    cfg = tmp_path / "c.toml"
    cfg.write_text("[train]\nepochs = 2\n")
    with pytest.raises(ConfigError, match=r"^--set train.batch_size=abc: expected an integer, "
                                          r"found 'abc'$"):
        load_volume_config(cfg, ["train.batch_size=abc"])
    with pytest.raises(ConfigError, match=r"^--set train.batchsize=3: unknown setting"):
        load_volume_config(cfg, ["train.batchsize=3"])
    cfg.write_text("[train]\nepochs = \"many\"\n")  # the file's own mistake names the file
    with pytest.raises(ConfigError, match=r"c.toml.train.epochs: expected an integer"):
        load_volume_config(cfg, ["train.batch_size=4"])
