"""The whole pipeline and the runner: outputs, resume, failure isolation, bad input, pools."""

from __future__ import annotations

import errno
import json
import os
import pathlib
from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.errors import ConfigError, OutputError
from adni_pu.preprocessing import (
    PreprocessConfig,
    Scan,
    load_config,
    output_paths,
    preprocess_scan,
    run_preprocessing,
)
from adni_pu.preprocessing import pipeline as pipe
from adni_pu.preprocessing.io import discover_scans
from adni_pu.preprocessing.phantom import synthetic_head
from adni_pu.preprocessing.runner import shard_scans
from adni_pu.preprocessing.summary import SUMMARY_COLUMNS, parse_shard

FAST = [
    'skullstrip.method="template"',
    "registration.resolution_mm=4.0",
    "registration.iterations=[50, 20]",
    "registration.shrink_factors=[2, 1]",
    "registration.smoothing_sigmas=[1.0, 0.0]",
    "grid.spacing_mm=3.0",
    "grid.shape=[61, 73, 61]",
]


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    return float(2 * (a & b).sum() / (a.sum() + b.sum()))


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """Two synthetic heads (one with permuted + flipped voxel axes) and one broken file."""
    root = tmp_path_factory.mktemp("run")
    head = synthetic_head(rotation_deg=(4.0, 0.0, -6.0), translation_mm=(3.0, 5.0, -2.0), seed=2)
    inputs = root / "in"
    inputs.mkdir()
    nib.save(nib.Nifti1Image(head.data, head.affine), str(inputs / "headA.nii.gz"))
    perm = (1, 2, 0)
    pdata = np.transpose(head.data, perm)[:, ::-1]
    paff = head.affine[:, list(perm) + [3]].copy()
    paff[:, 3] += paff[:, 1] * (pdata.shape[1] - 1)
    paff[:, 1] *= -1
    nib.save(nib.Nifti1Image(pdata, paff), str(inputs / "headB.nii.gz"))
    (inputs / "broken.nii.gz").write_bytes(b"\x1f\x8b truncated")
    out = root / "out"
    summary = run_preprocessing(inputs, out, load_config(None, FAST), progress=False)
    return head, inputs, out, summary


def test_run_writes_the_documented_layout(real_run) -> None:
    head, inputs, out, summary = real_run
    assert list(summary.columns) == SUMMARY_COLUMNS
    status = dict(zip(summary.subject_id, summary.status))
    assert status == {"broken": "failed", "headA": "done", "headB": "done"}
    err = summary.set_index("subject_id").loc["broken", "error"]
    assert "broken.nii.gz" in err and "expected" in err
    on_disk = pd.read_csv(out / "summary.csv")
    assert list(on_disk.status) == list(summary.status)
    assert (out / "preprocess_config.toml").is_file()
    paths = output_paths(Scan("headA", "01", inputs / "headA.nii.gz"), out,
                         load_config(None, FAST))
    for key in ("preproc", "brainmask_template", "brainmask_native", "cerebellum_template",
                "cerebellum_native", "affine", "qc", "sidecar"):
        assert paths[key].is_file(), key
    assert paths["preproc"].name == (
        "sub-headA_ses-01_space-MNI152NLin2009aSym_res-3mm_desc-preproc_T1w.nii.gz")
    pre = nib.load(str(paths["preproc"]))
    assert pre.shape == (61, 73, 61)
    assert np.allclose(pre.affine[:3, :3], np.eye(3) * 3.0)
    vals = pre.get_fdata()
    assert vals.min() == 0 and vals.max() <= 1.0 and (vals > 0).mean() > 0.1
    cer_t = nib.load(str(paths["cerebellum_template"])).get_fdata() > 0
    assert not (vals[cer_t] > 0).any()  # cerebellum removed in template space
    side = json.loads(paths["sidecar"].read_text())
    assert side["status"] == "done" and side["settings_hash"]
    assert {"n4", "skullstrip", "registration", "cerebellum", "resample", "qc"} <= set(
        side["timings_s"])
    assert 1500 < side["qc"]["brain_volume_ml"] < 2300
    assert side["qc"]["registration_similarity"] > 0.8
    assert {"mask_edge_contrast", "brain_noise", "template_mask_dice", "template_end_coverage",
            "registration_gain"} <= set(side["qc"])  # the calibrated QC metrics
    assert "SimpleITK" in side["versions"] and "antspyx" in side["versions"]
    assert side["settings"]["skullstrip"]["method"] == "template"
    native = nib.load(str(paths["brainmask_native"]))
    assert native.shape == head.data.shape and np.allclose(native.affine, head.affine)
    brain = native.get_fdata() > 0
    assert _dice(brain, head.brain) > 0.93
    cer = nib.load(str(paths["cerebellum_native"])).get_fdata() > 0
    assert (cer & head.cerebellum).sum() / head.cerebellum.sum() > 0.9
    assert (cer & head.brain & ~head.cerebellum).sum() / (head.brain & ~head.cerebellum).sum() < 0.04


def test_permuted_and_flipped_axes_give_the_same_masks(real_run) -> None:
    head, inputs, out, _ = real_run
    masks = {}
    for name in ("headA", "headB"):
        p = output_paths(Scan(name, "01", inputs / f"{name}.nii.gz"), out)["brainmask_native"]
        img = nib.load(str(p))
        assert img.shape == nib.load(str(inputs / f"{name}.nii.gz")).shape  # the scan's own grid
        masks[name] = nib.as_closest_canonical(img).get_fdata() > 0
    assert _dice(masks["headA"], masks["headB"]) > 0.97


def test_rerun_skips_done_scans_and_retries_failures(real_run) -> None:
    _, inputs, out, _ = real_run
    again = run_preprocessing(inputs, out, load_config(None, FAST + ["runner.workers=3"]),
                              progress=False)
    status = dict(zip(again.subject_id, again.status))
    assert status == {"broken": "failed", "headA": "skipped", "headB": "skipped"}


def _fake_steps(calls: list):
    def fake(scan, paths, config, timings):
        calls.append(scan.subject_id)
        timings["read"] = 0.0
        files = {paths["preproc"]: b"volume", paths["brainmask_native"]: b"mask",
                 paths["qc"]: b"png"}
        return files, "done", [], {"qc": {"brain_volume_ml": 1200.0}}
    return fake


def test_changed_settings_redo_the_scan(tmp_path: Path, monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(pipe, "_run_steps", _fake_steps(calls))
    scan = Scan("s1", "bl", tmp_path / "in.nii.gz")
    scan.path.write_bytes(b"scan")
    cfg = PreprocessConfig()
    assert preprocess_scan(scan, tmp_path / "o", cfg)["status"] == "done"
    assert preprocess_scan(scan, tmp_path / "o", cfg)["status"] == "skipped"
    cfg2 = load_config(None, ["n4.shrink_factor=2"])
    assert preprocess_scan(scan, tmp_path / "o", cfg2)["status"] == "done"
    # an output deleted by hand means the scan is not done
    output_paths(scan, tmp_path / "o")["qc"].unlink()
    assert preprocess_scan(scan, tmp_path / "o", cfg2)["status"] == "done"
    assert calls == ["s1", "s1", "s1"]


ONE_WORKER = ["runner.workers=1", "runner.progress=false"]


def test_an_input_replaced_at_the_same_path_is_redone_and_the_summary_says_so(
        tmp_path: Path, monkeypatch) -> None:
    import os

    from adni_pu.fileio import sha256_file

    calls: list[str] = []
    monkeypatch.setattr(pipe, "_run_steps", _fake_steps(calls))
    scan = Scan("s1", "bl", tmp_path / "in.nii.gz")
    scan.path.write_bytes(b"head A")
    cfg = load_config(None, ONE_WORKER)
    first = run_preprocessing([scan], tmp_path / "o", cfg)
    assert list(first.status) == ["done"] and first.input_sha256[0] == sha256_file(scan.path)
    again = run_preprocessing([scan], tmp_path / "o", cfg)
    assert list(again.status) == ["skipped"] and again.input_sha256[0] == first.input_sha256[0]
    # another head copied over it, keeping size and modification time (cp -p)
    stamp = scan.path.stat()
    scan.path.write_bytes(b"head B")
    os.utime(scan.path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    redone = run_preprocessing([scan], tmp_path / "o", cfg)
    assert list(redone.status) == ["done"] and calls == ["s1", "s1"]
    assert "the input changed since its outputs were made" in redone.note[0]
    assert redone.input_sha256[0] == sha256_file(scan.path) != first.input_sha256[0]
    on_disk = pd.read_csv(tmp_path / "o" / "summary.csv", keep_default_na=False)
    assert "input changed" in on_disk.note[0]


def test_summary_keeps_the_scans_of_an_earlier_run_into_the_same_folder(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(pipe, "_run_steps", _fake_steps([]))
    a, b, c = (Scan(n, "1", tmp_path / f"{n}.nii.gz") for n in "abc")
    for scan in (a, b, c):
        scan.path.write_bytes(scan.subject_id.encode())
    cfg = load_config(None, ONE_WORKER)
    run_preprocessing([a, c], tmp_path / "o", cfg)
    second = run_preprocessing([b], tmp_path / "o", cfg)
    rows = second.set_index("subject_id")
    assert list(rows.status) == ["done", "done", "done"]
    assert rows.loc["a", "note"] == "kept from an earlier run into this folder"
    on_disk = pd.read_csv(tmp_path / "o" / "summary.csv", keep_default_na=False)
    assert sorted(on_disk.subject_id) == ["a", "b", "c"]
    again = run_preprocessing([b], tmp_path / "o", cfg).set_index("subject_id")
    assert again.loc["a", "note"] == "kept from an earlier run into this folder"  # once
    # outputs deleted by hand, or made with other settings than this run's: still listed,
    # no longer usable, and the note says why
    output_paths(c, tmp_path / "o")["preproc"].unlink()
    third = run_preprocessing([b], tmp_path / "o", load_config(None, ONE_WORKER + [
        "n4.shrink_factor=2"])).set_index("subject_id")
    assert third.loc["a", "status"] == "stale" and "other settings" in third.loc["a", "note"]
    assert third.loc["c", "status"] == "missing" and "gone" in third.loc["c", "note"]


@pytest.mark.parametrize("error", [
    OSError(errno.ENOSPC, "No space left on device"),
    PermissionError(errno.EACCES, "Permission denied"),
])
def test_full_disk_or_no_permission_leaves_no_half_outputs(
    tmp_path: Path, monkeypatch, error: OSError
) -> None:
    import adni_pu.preprocessing.io as pio

    monkeypatch.setattr(pipe, "_run_steps", _fake_steps([]))
    real = pio.write_file_atomic
    n = {"calls": 0}

    def failing(path, data):
        n["calls"] += 1
        if n["calls"] >= 2:
            raise error
        return real(path, data)

    monkeypatch.setattr(pio, "write_file_atomic", failing)
    scans = [Scan("bad", "1", tmp_path / "a.nii.gz"), Scan("good", "1", tmp_path / "b.nii.gz")]
    row = preprocess_scan(scans[0], tmp_path / "o", PreprocessConfig())
    assert row["status"] == "failed"
    assert error.strerror in row["error"] and "cannot write outputs" in row["error"]
    folder = scans[0].out_dir(tmp_path / "o")
    assert not folder.exists() or list(folder.iterdir()) == []
    monkeypatch.setattr(pio, "write_file_atomic", real)
    assert preprocess_scan(scans[1], tmp_path / "o", PreprocessConfig())["status"] == "done"


@pytest.fixture(scope="module")
def small_head_file(tmp_path_factory) -> Path:
    head = synthetic_head(seed=5)
    path = tmp_path_factory.mktemp("one") / "h.nii.gz"
    nib.save(nib.Nifti1Image(head.data, head.affine), str(path))
    return path


@pytest.mark.parametrize("mask_kind, expected", [("empty", "empty"), ("everything", "skull")])
def test_implausible_masks_are_failed_qc_not_written(
    small_head_file: Path, tmp_path: Path, monkeypatch, mask_kind: str, expected: str
) -> None:
    import adni_pu.preprocessing.skullstrip as ss

    def fake_strip(data, affine, settings, reg_settings=None):
        return np.zeros(data.shape, bool) if mask_kind == "empty" else data > 0

    monkeypatch.setattr(ss, "skull_strip", fake_strip)
    scan = Scan("h", "1", small_head_file)
    cfg = load_config(None, FAST)
    paths = output_paths(scan, tmp_path, cfg)
    other_grid = output_paths(scan, tmp_path, PreprocessConfig())["preproc"]
    paths["preproc"].parent.mkdir(parents=True)
    for stale in (paths["preproc"], other_grid):
        stale.write_bytes(b"stale result of an earlier run")
    row = preprocess_scan(scan, tmp_path, cfg)
    assert row["status"] == "failed-qc" and expected in row["error"]
    assert row["preprocessed_path"] == ""
    assert not paths["preproc"].exists()  # never left as if good
    assert not other_grid.exists()  # nor one made on another grid
    side = json.loads(paths["sidecar"].read_text())
    assert side["status"] == "failed-qc" and paths["qc"].is_file()


def test_process_pool_isolates_failures_and_shards(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    flat = np.zeros((40, 40), np.float32)
    nib.save(nib.Nifti1Image(flat, np.eye(4)), str(inputs / "a2d.nii.gz"))
    d = np.random.default_rng(0).normal(size=(40, 40, 40)).astype(np.float32)
    d[0, 0, 0] = np.nan
    nib.save(nib.Nifti1Image(d, np.diag([3.0, 3, 3, 1])), str(inputs / "bnan.nii.gz"))
    (inputs / "ctext.nii").write_text("not an image")
    summary = run_preprocessing(inputs, tmp_path / "out", workers=2, progress=False)
    assert list(summary.subject_id) == ["a2d", "bnan", "ctext"]
    assert set(summary.status) == {"failed"}
    assert "3D" in summary.error[0] and "NaN" in summary.error[1] and "NIfTI" in summary.error[2]
    shard = run_preprocessing(inputs, tmp_path / "out", shard="2/2", progress=False)
    assert list(shard.subject_id) == ["bnan"]
    assert (tmp_path / "out/summary_shard-2-of-2.csv").is_file()


def test_shard_parsing() -> None:
    scans = [Scan(str(i), "1", Path(f"{i}.nii")) for i in range(7)]
    parts = [shard_scans(scans, f"{i}/3") for i in (1, 2, 3)]
    assert sorted(s.subject_id for p in parts for s in p) == [str(i) for i in range(7)]
    assert parse_shard("2/10") == (2, 10)
    for bad in ("0/3", "4/3", "x", "1-3"):
        with pytest.raises(ValueError, match="shard"):
            parse_shard(bad)


def test_dask_local_cluster_backend(tmp_path: Path, monkeypatch) -> None:
    distributed = pytest.importorskip("dask.distributed")
    monkeypatch.setattr(pipe, "_run_steps", _fake_steps([]))
    scans = [Scan(f"d{i}", "1", tmp_path / f"{i}.nii.gz") for i in range(3)]
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        summary = run_preprocessing(scans, tmp_path / "o", dask_scheduler=client, progress=False)
    assert list(summary.subject_id) == ["d0", "d1", "d2"]
    assert set(summary.status) == {"done"}


def test_relative_output_gives_a_summary_valid_from_any_folder(tmp_path: Path,
                                                                monkeypatch) -> None:
    """summary.csv is read by the cohort builder relative to its own folder, not the cwd."""
    monkeypatch.setattr(pipe, "_run_steps", _fake_steps([]))
    monkeypatch.chdir(tmp_path)
    scans = [Scan("s1", "bl", tmp_path / "in.nii.gz")]
    scans[0].path.write_bytes(b"scan")
    summary = run_preprocessing(scans, Path("rel") / "out", workers=1, progress=False)
    again = run_preprocessing(scans, Path("rel") / "out", workers=1, progress=False)
    for table in (summary, again):
        path = Path(table.preprocessed_path[0])
        assert path.is_absolute() and path.is_file(), path
    assert list(again.status) == ["skipped"]


def test_singular_affine_is_a_one_line_error(tmp_path: Path) -> None:
    img = nib.Nifti1Image(np.random.default_rng(0).random((30, 30, 30), np.float32),
                          np.diag([3.0, 3.0, 3.0, 1.0]))
    img.set_sform(np.diag([3.0, 3.0, 0.0, 1.0]), code=2)  # the affine nibabel reads back
    path = tmp_path / "flat.nii.gz"
    nib.save(img, str(path))
    summary = run_preprocessing([path], tmp_path / "o", progress=False)
    error = summary.error[0]
    assert summary.status[0] == "failed" and "invertible" in error and str(path) in error
    assert "\n" not in error
    assert "\n" not in (tmp_path / "o/summary.csv").read_text().split("\n", 1)[1].rstrip("\n")


def test_last_shard_merges_the_shard_summaries(tmp_path: Path, monkeypatch) -> None:
    """Each shard writes its own summary; the last to finish (whatever the backend) also
    writes summary.csv, the one table the cohort builder reads."""
    distributed = pytest.importorskip("dask.distributed")
    monkeypatch.setattr(pipe, "_run_steps", _fake_steps([]))
    scans = [Scan(f"m{i}", "1", tmp_path / f"{i}.nii.gz") for i in range(5)]
    out = tmp_path / "o"
    first = run_preprocessing(scans, out, shard="2/2", progress=False)
    assert list(first.subject_id) == ["m1", "m3"]
    assert not (out / "summary.csv").exists()
    assert first.attrs["summary_path"] == str(out / "summary_shard-2-of-2.csv")
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        last = run_preprocessing(scans, out, shard="1/2", dask_scheduler=client,
                                 progress=False)
    assert last.attrs["summary_path"] == str(out / "summary.csv")
    merged = pd.read_csv(out / "summary.csv", dtype={"subject_id": str},
                         keep_default_na=False)
    assert list(merged.columns) == SUMMARY_COLUMNS
    assert list(merged.subject_id) == [f"m{i}" for i in range(5)]
    assert set(merged.status) == {"done"} and (merged.error == "").all()


def test_resume_keys_on_the_file_and_its_content_not_the_path_as_typed(
        tmp_path: Path, monkeypatch) -> None:
    """A rerun from another working folder, or through a link,
    skips the scan; a copy with the same content is reused with a note; new content at the
    same path, or another file's content, is redone."""
    import shutil

    calls: list[str] = []
    monkeypatch.setattr(pipe, "_run_steps", _fake_steps(calls))
    cfg = load_config(None, ONE_WORKER)
    rel = tmp_path / "rel"
    (rel / "in").mkdir(parents=True)
    (rel / "in" / "a.nii").write_bytes(b"head A")
    monkeypatch.chdir(rel)
    first = run_preprocessing([Scan("s1", "bl", Path("in/a.nii"))], Path("out"), cfg)
    assert list(first.status) == ["done"]
    side = json.loads(next((rel / "out").rglob("*_desc-preproc_T1w.json")).read_text())
    assert side["input_resolved"] == str(rel / "in" / "a.nii")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link.nii").symlink_to(rel / "in" / "a.nii")
    for typed in ("rel/in/a.nii", "rel/./in/../in/a.nii", "link.nii"):
        again = run_preprocessing([Scan("s1", "bl", Path(typed))], Path("rel/out"), cfg)
        assert list(again.status) == ["skipped"], typed
        assert again.note[0] == "", typed
    shutil.copy(rel / "in" / "a.nii", tmp_path / "copy.nii")
    copied = run_preprocessing([Scan("s1", "bl", Path("copy.nii"))], Path("rel/out"), cfg)
    assert list(copied.status) == ["skipped"] and calls == ["s1"]
    assert copied.note[0].startswith(f"reused: earlier outputs came from {rel / 'in' / 'a.nii'}")
    (tmp_path / "other.nii").write_bytes(b"head B")
    other = run_preprocessing([Scan("s1", "bl", Path("other.nii"))], Path("rel/out"), cfg)
    assert list(other.status) == ["done"] and calls == ["s1", "s1"]
    assert other.note[0].startswith("redone: earlier outputs came from")
    (tmp_path / "other.nii").write_bytes(b"head C")  # new content at the same path
    replaced = run_preprocessing([Scan("s1", "bl", Path("other.nii"))], Path("rel/out"), cfg)
    assert list(replaced.status) == ["done"] and calls == ["s1", "s1", "s1"]
    assert "the input changed since its outputs were made" in replaced.note[0]


# ---------------------------------------- inputs that are outputs, a full disk, odd names


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
    """The case reported: an already-preprocessed volume whose output path is itself. The
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
