"""``adni-pu preprocess`` and ``adni-pu qc`` through Typer's test runner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
from typer.testing import CliRunner

from adni_pu.cli.app import app


def test_cli_module_imports_nothing_heavy() -> None:
    code = ("import sys, adni_pu.cli.preprocess; "
            "print(sorted(m for m in ('torch','SimpleITK','ants','monai','nibabel') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_help_lists_both_verbs() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "preprocess" in result.output and "qc" in result.output


def test_preprocess_reports_bad_scans_and_exits_nonzero(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    nib.save(nib.Nifti1Image(np.zeros((40, 40, 40), np.float32), np.diag([3.0, 3, 3, 1])),
             str(inputs / "blank.nii.gz"))
    result = CliRunner().invoke(app, ["preprocess", str(inputs), str(tmp_path / "out"),
                                      "--no-progress", "--set", "n4.shrink_factor=2"])
    assert result.exit_code == 1, result.output
    assert "1 failed" in result.output and "blank.nii.gz" in result.output
    assert "constant volume" in result.output
    assert "shrink_factor = 2" in (tmp_path / "out/preprocess_config.toml").read_text()


def test_preprocess_refuses_a_bad_setting(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["preprocess", str(tmp_path), str(tmp_path / "o"),
                                      "--set", "skullstrip.method=magic"])
    assert result.exit_code == 2
    assert "skullstrip.method" in result.output


def _fake_output(root: Path, label: str, volume: float, status: str = "done") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from adni_pu.preprocessing.derivatives import scan_names

    names = scan_names(label, "01", "1p5mm")
    for kind in ("qc", "sidecar"):
        (root / names[kind]).parent.mkdir(parents=True, exist_ok=True)
    plt.imsave(root / names["qc"], np.random.default_rng(0).random((20, 30)))
    side = {"scan_label": f"sub-{label}_ses-01", "status": status, "error": "",
            "qc": {"brain_volume_ml": volume, "registration_similarity": 0.8,
                   "brain_fraction_of_head": 0.5, "cerebellum_fraction_of_brain": 0.1},
            "outputs": {"qc": names["qc"]}}
    (root / names["sidecar"]).write_text(json.dumps(side))


def test_qc_contact_sheet_lists_outliers_first(tmp_path: Path) -> None:
    for i in range(6):
        _fake_output(tmp_path, f"n{i}", 1200.0 + 15 * i)
    _fake_output(tmp_path, "odd", 2300.0)
    _fake_output(tmp_path, "refused", 0.0, status="failed-qc")
    result = CliRunner().invoke(app, ["qc", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = [ln.strip() for ln in result.output.splitlines() if ln.startswith("  ")]
    assert lines[0].startswith("sub-refused_ses-01") and lines[1].startswith("sub-odd_ses-01")
    assert "2 outlier(s)" in result.output
    sheet = tmp_path / "qc_contact_sheet.png"
    assert (tmp_path / "qc" / "index.html").is_file() and not sheet.exists()  # the report
    result = CliRunner().invoke(app, ["qc", str(tmp_path), "--sheet"])  # and the sheet
    assert result.exit_code == 0, result.output
    assert sheet.is_file() and sheet.stat().st_size > 1000


def test_qc_on_an_empty_folder_fails_clearly(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["qc", str(tmp_path)])
    assert result.exit_code == 2 and "desc-preproc_T1w.json" in result.output


def test_preprocess_into_an_existing_file_is_a_one_line_error(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("keep me")
    result = CliRunner().invoke(app, ["preprocess", str(tmp_path), str(target)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        f"error: {target.resolve()}: expected an output folder, found a file"]
    assert target.read_text() == "keep me"


def test_refused_input_leaves_no_output_folder(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.txt").write_text("no scans here")
    result = CliRunner().invoke(app, ["preprocess", str(tmp_path / "in"), str(tmp_path / "o")])
    assert result.exit_code == 2 and "found no scans" in result.output, result.output
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------ adni-pu qc of a missing folder


def test_qc_of_a_folder_that_does_not_exist_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "nothing here"
    result = CliRunner().invoke(app, ["qc", str(missing)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith(f"error: folder not found: {missing}")
    (tmp_path / "file").write_text("x")
    result = CliRunner().invoke(app, ["qc", str(tmp_path / "file")])
    assert result.exit_code == 2 and "expected a folder" in result.output
    assert not missing.exists()
