"""Issue 37, preprocessing: findings 2, 6, 15a, 16, 18, 22 and 30a, each reproduced first.

Unit tests use the synthetic head (adni_pu.preprocessing.phantom) or a fake pipeline step;
the Colin27 test uses ../shared/data and skips when it is absent.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from conftest import shared_path
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.errors import ConfigError, OutputError, ScanError
from adni_pu.preprocessing import (
    PreprocessConfig,
    Scan,
    load_config,
    output_paths,
    preprocess_scan,
    run_preprocessing,
)
from adni_pu.preprocessing import pipeline as pipe
from adni_pu.preprocessing.config import QCSettings
from adni_pu.preprocessing.intensity import intensity_floor, normalise
from adni_pu.preprocessing.io import discover_scans, read_scan_list_csv
from adni_pu.preprocessing.phantom import synthetic_head
from adni_pu.preprocessing.qc import (
    brain_noise,
    mask_edge_contrast,
    mask_edge_offset_mm,
    qc_checks,
    registration_metrics,
)

# ----------------------------------------------------------------------------- 2: offsets


def _mask_metrics(data: np.ndarray, brain: np.ndarray, spacing: tuple[float, ...]) -> dict:
    return {"brain_volume_ml": 1500.0,
            "mask_edge_contrast": mask_edge_contrast(data, brain, spacing),
            "mask_edge_offset_mm": mask_edge_offset_mm(data, brain, spacing),
            "brain_noise": brain_noise(data, brain, spacing)}


@pytest.mark.parametrize("noise", [0.02, 0.15])
def test_qc_of_a_head_stored_with_an_offset_is_that_of_the_head(noise) -> None:
    """The issue's int16 ``x * 10 - 1000``: the noise and edge checks read 0 (and passed)
    whatever the head; now they read what the head reads, and decide alike."""
    head = synthetic_head(noise=noise, seed=3)
    spacing = (3.0, 3.0, 3.0)
    plain = _mask_metrics(head.data, head.brain, spacing)
    for stored in (np.round(head.data * 10 - 1000).astype(np.int16), head.data + 500.0):
        shifted = _mask_metrics(stored, head.brain, spacing)
        for name, value in plain.items():
            assert shifted[name] == pytest.approx(value, rel=2e-3, abs=2e-3), name
        assert qc_checks(shifted, QCSettings()) == qc_checks(plain, QCSettings())
    refused = qc_checks(plain, QCSettings())
    assert (noise > 0.1) == any("too noisy" in p for p in refused), (plain, refused)
    # the registration check's correlation with the template does not move either
    t2n = np.linalg.inv(head.native_to_template)
    a = registration_metrics(head.data, head.brain, head.affine, t2n, 4.0)
    b = registration_metrics(head.data * 10 - 1000, head.brain, head.affine, t2n, 4.0)
    assert a == pytest.approx(b, abs=2e-4)


def test_a_brain_mask_no_brighter_than_the_air_fails_the_checks() -> None:
    """A 0 used to mean "fine" when the brain read <= 0; a mask on the air now fails."""
    head = synthetic_head(noise=0.02)
    spacing = (3.0, 3.0, 3.0)
    air = np.zeros_like(head.brain)
    air[:14, :14, :14] = True  # a corner of the field of view: air only
    noise = brain_noise(head.data, air, spacing)
    assert noise == float("inf")
    problems = qc_checks({"brain_volume_ml": 1500.0, "brain_noise": noise}, QCSettings())
    assert problems == ["the brain is no brighter than the air: no usable signal"]
    # an offset that makes the air negative changes nothing
    assert brain_noise(head.data - 50, air, spacing) == float("inf")


def test_intensity_floor_is_the_air_and_follows_an_offset() -> None:
    head = synthetic_head(noise=0.02)
    assert intensity_floor(head.data) == 0.0  # the phantom's air is clipped at 0
    assert intensity_floor(head.data * 3 - 70) == pytest.approx(-70, abs=1e-3)
    mask = head.brain
    x = head.data.astype(np.float64)
    settings = PreprocessConfig().intensity
    assert np.allclose(normalise(x * 7 - 300, mask, settings), normalise(x, mask, settings),
                       atol=1e-6)


FAST = ['skullstrip.method="template"', "registration.resolution_mm=4.0",
        "registration.iterations=[30, 10]", "registration.shrink_factors=[2, 1]",
        "registration.smoothing_sigmas=[1.0, 0.0]", "grid.spacing_mm=3.0",
        "grid.shape=[61, 73, 61]", "qc.min_brain_ml=100"]


def test_model_input_of_a_scan_stored_with_an_offset_is_that_of_the_scan(
        tmp_path: Path, monkeypatch) -> None:
    """N4 (on), the fill around the brain before resampling and the normalisation: the
    same head stored as ``x * 10 - 1000`` gives the same model input and QC. The brain
    mask and the registration are held fixed (the true mask and the true transform, the
    identity), since ANTs itself answers a scaled image with a transform a few hundredths
    of a mm away."""
    import ants

    from adni_pu.preprocessing import registration as R
    from adni_pu.preprocessing import skullstrip

    head = synthetic_head(spacing=4.0, shape=(48, 57, 48), bias_strength=0.3, seed=1)
    assert np.allclose(head.native_to_template, np.eye(4))
    mat = tmp_path / "identity.mat"
    ants.write_transform(ants.create_ants_transform(transform_type="AffineTransform",
                                                    dimension=3), str(mat))
    fit = R.Registration(fwd=[str(mat)], inv=[str(mat)], inv_invert=[True],
                         template_to_native=np.eye(4), similarity=1.0, workdir=str(tmp_path),
                         files={"affine.mat": mat.read_bytes()})
    monkeypatch.setattr(R, "register_to_template", lambda *args, **kwargs: fit)
    monkeypatch.setattr(R, "cleanup", lambda reg: None)
    monkeypatch.setattr(skullstrip, "skull_strip", lambda data, *a, **k: head.brain.copy())
    # the true mask of a 4 mm head ends a voxel short of where the check wants it
    cfg = load_config(None, [*FAST, "qc.max_mask_edge_offset_mm=3.0"])
    out: dict[str, tuple[np.ndarray, dict]] = {}
    for name, data in (("plain", head.data), ("shifted", head.data * 10 - 1000)):
        path = tmp_path / f"{name}.nii.gz"
        nib.save(nib.Nifti1Image(data.astype(np.float32), head.affine), str(path))
        row = preprocess_scan(path, tmp_path / "out", cfg)
        assert row["status"] == "done", row["error"]
        side = json.loads(output_paths(Scan(name, "01", path), tmp_path / "out")
                          ["sidecar"].read_text())
        out[name] = (nib.load(row["preprocessed_path"]).get_fdata(), side)
    (a, side_a), (b, side_b) = out["plain"], out["shifted"]
    assert np.abs(a - b).max() < 1e-3
    assert side_b["input"]["intensity_floor"] == pytest.approx(-1000, abs=1e-2)
    for name in ("mask_edge_contrast", "mask_edge_offset_mm", "brain_noise",
                 "registration_similarity"):
        assert side_b["qc"][name] == pytest.approx(side_a["qc"][name], abs=2e-3), name


def _rician(data: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Rician noise of sigma = ``fraction`` of the 99th intensity percentile."""
    rng = np.random.default_rng(seed)
    sigma = fraction * float(np.percentile(data, 99))
    real = data + rng.normal(0, sigma, data.shape)
    return np.sqrt(real**2 + rng.normal(0, sigma, data.shape) ** 2).astype(np.float32)


@pytest.mark.integration
def test_colin27_stored_with_an_offset_is_judged_as_colin27() -> None:
    """The issue's reproduction: Colin27 at 2 mm, clean and with 15 % Rician noise, as
    int16 ``x * 10 - 1000``."""
    from test_preprocessing_qc import _colin27_2mm

    shared_path("mri", "colin27")
    data, brain, _affine = _colin27_2mm()
    spacing = (2.0, 2.0, 2.0)
    for image in (data, _rician(data, 0.15, 3)):
        plain = _mask_metrics(image, brain, spacing)
        shifted = _mask_metrics(np.round(image * 10 - 1000).astype(np.int16), brain, spacing)
        for name, value in plain.items():
            assert shifted[name] == pytest.approx(value, rel=2e-3, abs=2e-3), name
        assert qc_checks(shifted, QCSettings()) == qc_checks(plain, QCSettings())
    assert plain["brain_noise"] > QCSettings().max_brain_noise  # the noisy one is refused


# ----------------------------------------------------------------------------- 6: inputs


def _fake_steps(calls: list):
    def fake(scan, paths, config, timings):
        calls.append(scan.subject_id)
        files = {paths["preproc"]: b"volume", paths["brainmask_native"]: b"mask",
                 paths["qc"]: b"png"}
        return files, "done", [], {"qc": {"brain_volume_ml": 1200.0}}
    return fake


def _earlier_outputs(out: Path, subject: str = "s1") -> dict[str, Path]:
    """A scan's outputs as an earlier run left them (each file holds its own name)."""
    paths = output_paths(Scan(subject, "01", out / "x.nii.gz"), out)
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(path.name.encode())
    return paths


def _intact(paths: dict[str, Path]) -> bool:
    return all(p.read_bytes() == p.name.encode() for p in paths.values())


def test_an_output_given_back_as_input_is_refused_and_never_deleted(tmp_path: Path) -> None:
    """The issue's case: an already-preprocessed volume whose output path is itself. The
    read failed (or QC did) and the cleanup of the "older volume" deleted it and its masks."""
    out = tmp_path / "out"
    paths = _earlier_outputs(out)
    with pytest.raises(OutputError, match="this scan's own input") as err:
        run_preprocessing(paths["preproc"], out, PreprocessConfig(), progress=False)
    assert "nothing was processed" in str(err.value)
    assert _intact(paths) and not (out / "summary.csv").exists()
    # the library's one-scan call refuses it too, and writes nothing
    row = preprocess_scan(paths["preproc"], out, PreprocessConfig())
    assert row["status"] == "failed" and "own input" in row["error"]
    assert _intact(paths)


def test_a_hard_link_to_an_output_is_the_same_input(tmp_path: Path) -> None:
    out = tmp_path / "out"
    paths = _earlier_outputs(out)
    (tmp_path / "in").mkdir()
    link = tmp_path / "in" / "s1.nii.gz"
    os.link(paths["brainmask_native"], link)
    row = preprocess_scan(link, out, PreprocessConfig())
    assert row["status"] == "failed" and "brainmask_native" in row["error"], row
    assert _intact(paths)


def test_a_csv_listing_another_scans_output_is_refused(tmp_path: Path, monkeypatch) -> None:
    """Scan s1's cleanup would delete the file the CSV gives as scan s2."""
    calls: list[str] = []
    monkeypatch.setattr(pipe, "_run_steps", _fake_steps(calls))
    out = tmp_path / "out"
    paths = _earlier_outputs(out)
    (tmp_path / "s1.nii.gz").write_bytes(b"scan")
    listing = tmp_path / "scans.csv"
    listing.write_text(f"subject,path\ns1,s1.nii.gz\ns2,{paths['cerebellum_native']}\n")
    with pytest.raises(OutputError, match=f"is the input {paths['cerebellum_native']}"):
        run_preprocessing(listing, out, PreprocessConfig(), progress=False)
    assert calls == [] and _intact(paths)


def test_the_runs_own_summary_as_its_input_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(pipe, "_run_steps", _fake_steps([]))
    (tmp_path / "a.nii.gz").write_bytes(b"scan")
    out = tmp_path / "out"
    run_preprocessing(tmp_path / "a.nii.gz", out, PreprocessConfig(), progress=False)
    before = (out / "summary.csv").read_bytes()
    with pytest.raises(OutputError, match="run's own summary.csv"):
        run_preprocessing(out / "summary.csv", out, PreprocessConfig(), progress=False)
    assert (out / "summary.csv").read_bytes() == before


def test_the_cleanup_spares_an_input(tmp_path: Path) -> None:
    from adni_pu.preprocessing.output_checks import InputIndex

    paths = _earlier_outputs(tmp_path / "out")
    pipe._remove_stale(paths, keep=(), spare=InputIndex([paths["qc"]]))
    assert [p for p in paths.values() if p.exists()] == [paths["qc"]]


# ----------------------------------------------------------------------------- 15a: disk


def test_a_full_disk_on_the_settings_file_is_one_line_naming_it(tmp_path: Path,
                                                                monkeypatch) -> None:
    """ENOSPC from the writer carries no file name: the command line showed a traceback."""
    real = pathlib.Path.write_text

    def full(self, *args, **kwargs):
        if self.name.startswith(".preprocess_config.toml."):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    (tmp_path / "a.nii.gz").write_bytes(b"scan")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["preprocess", str(tmp_path / "a.nii.gz"), str(out),
                                      "--no-progress"])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # no traceback
    line = result.output.strip().splitlines()[-1]
    assert line == f"error: {out / 'preprocess_config.toml'}: No space left on device"
    assert not out.exists() or not any(p.name.startswith(".preprocess") for p in out.iterdir())


# ----------------------------------------------------------------------------- 16: names


def test_a_name_without_ascii_letters_gets_a_stable_label_and_the_batch_goes_on(
        tmp_path: Path, monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(pipe, "_run_steps", _fake_steps(calls))
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in ("患者", "ok1", "病人"):
        (inputs / f"{name}.nii.gz").write_bytes(name.encode())
    scans = {s.subject_id: s for s in discover_scans(inputs)}
    assert scans["患者"].label != scans["病人"].label
    assert scans["患者"].label.startswith("sub-hash") and scans["ok1"].label == "sub-ok1_ses-01"
    out = tmp_path / "out"
    summary = run_preprocessing(inputs, out, PreprocessConfig(), progress=False)
    assert sorted(summary.status) == ["done"] * 3
    row = summary.set_index("subject_id").loc["患者"]
    assert row["input_path"].endswith("患者.nii.gz")
    side = json.loads(output_paths(scans["患者"], out)["sidecar"].read_text())
    assert side["subject_id"] == "患者" and side["scan_label"] == scans["患者"].label
    again = run_preprocessing(inputs, out, PreprocessConfig(), progress=False)
    assert sorted(again.status) == ["skipped"] * 3  # the label is the same from run to run


@pytest.mark.parametrize("subject", ["..", "  ", "-"])
def test_a_csv_subject_without_letters_or_digits_names_its_line(tmp_path: Path,
                                                                subject: str) -> None:
    listing = tmp_path / "scans.csv"
    listing.write_text(f"subject,path\nok1,a.nii.gz\n{subject},b.nii.gz\n")
    with pytest.raises(ScanError, match=r"scans.csv: line 3: column subject: expected an id"):
        read_scan_list_csv(listing)
    listing.write_text("subject,session,path\n患者,基线,a.nii.gz\nok,1,\n")
    with pytest.raises(ScanError, match="line 3: column path"):
        read_scan_list_csv(listing)


# ----------------------------------------------------------------------------- 18: grid


@pytest.mark.parametrize("value", ["[0, 0, 0]", "[-1, 121, 121]", "[121, 145]",
                                   "[8, 145, 121]"])
def test_a_grid_of_no_voxels_is_refused_before_any_work(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match="grid.shape"):
        load_config(None, [f"grid.shape={value}"])
    (tmp_path / "a.nii.gz").write_bytes(b"scan")
    result = CliRunner().invoke(app, ["preprocess", str(tmp_path / "a.nii.gz"),
                                      str(tmp_path / "out"), "--set", f"grid.shape={value}"])
    assert result.exit_code == 2 and "grid.shape" in result.output
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="grid.spacing_mm"):
        load_config(None, ["grid.spacing_mm=0"])


# ----------------------------------------------------------------------------- 22: qc


def test_qc_of_a_folder_that_does_not_exist_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "nothing here"
    result = CliRunner().invoke(app, ["qc", str(missing)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith(f"error: folder not found: {missing}")
    (tmp_path / "file").write_text("x")
    result = CliRunner().invoke(app, ["qc", str(tmp_path / "file")])
    assert result.exit_code == 2 and "expected a folder" in result.output
    assert not missing.exists()


# ----------------------------------------------------------------------------- 30a: long


def test_a_name_too_long_for_the_file_system_fails_only_that_scan_up_front(
        tmp_path: Path, monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(pipe, "_run_steps", _fake_steps(calls))
    inputs = tmp_path / "in"
    inputs.mkdir()
    long_name = "a" * 240
    (inputs / f"{long_name}.nii.gz").write_bytes(b"scan")
    (inputs / "ok1.nii.gz").write_bytes(b"scan")
    out = tmp_path / "out"
    summary = run_preprocessing(inputs, out, PreprocessConfig(), progress=False).set_index(
        "subject_id")
    assert calls == ["ok1"]  # the long one never started
    assert summary.loc["ok1", "status"] == "done"
    bad = summary.loc[long_name]
    assert bad["status"] == "failed" and "too long" in bad["error"]
    from adni_pu.preprocessing.output_checks import name_max

    assert f"{long_name}.nii.gz" in bad["error"] and f"limit of {name_max(out)}" in bad["error"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["sub-ok1"]  # no empty one
