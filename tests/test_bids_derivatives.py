"""The preprocessing output is a BIDS derivatives dataset; the synthetic raw BIDS is valid BIDS.

pybids indexes the output and finds each file by its entities; the official BIDS validator
(bids-validator-deno, installed with the ``dev`` extra) passes the synthetic raw dataset and
the preprocessing output; a folder written with the earlier file names is refused in one
line naming the conversion, and the conversion renames it in place without redoing a scan.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import pandas as pd
import pytest
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.errors import OutputError
from adni_pu.preprocessing import Scan, load_config, output_paths, run_preprocessing
from adni_pu.preprocessing import pipeline as pipe
from adni_pu.preprocessing.derivatives import (
    NAMES,
    TEMPLATE,
    res_label,
    scan_names,
    write_description,
)
from adni_pu.preprocessing.phantom import synthetic_head

FAST = ['skullstrip.method="template"', "registration.resolution_mm=4.0",
        "registration.iterations=[50, 20]", "registration.shrink_factors=[2, 1]",
        "registration.smoothing_sigmas=[1.0, 0.0]", "grid.spacing_mm=3.0",
        "grid.shape=[61, 73, 61]"]
DOI = "doi:10.0000/synthetic.phantom"


def _validator() -> str | None:
    """The official BIDS validator (bids-validator-deno) beside this Python, or on PATH."""
    here = Path(sys.executable).parent / "bids-validator-deno"
    return str(here) if here.is_file() else shutil.which("bids-validator-deno")


def _validate(folder: Path) -> tuple[list[dict], list[dict]]:
    """(errors, warnings) of the BIDS validator on ``folder``; skips without the validator."""
    tool = _validator()
    if tool is None:
        pytest.skip("bids-validator-deno is not installed (pip install -e '.[dev]' with "
                    "-c constraints.txt installs it)")
    env = {**os.environ, "DENO_NO_UPDATE_CHECK": "1", "NO_COLOR": "1"}
    run = subprocess.run([tool, "--format", "json", str(folder)], capture_output=True,
                         text=True, env=env, timeout=300)
    try:
        issues = json.loads(run.stdout)["issues"]["issues"]
    except (ValueError, KeyError) as exc:
        raise AssertionError(f"validator gave no JSON (exit {run.returncode}): "
                             f"{run.stdout[-500:]} {run.stderr[-500:]}") from exc
    errors = [i for i in issues if i.get("severity") == "error"]
    return errors, [i for i in issues if i.get("severity") == "warning"]


def _shown(issues: list[dict]) -> list[tuple]:
    return sorted({(i.get("code"), i.get("subCode"), i.get("location")) for i in issues})


@pytest.fixture(scope="module")
def preprocessed(tmp_path_factory):
    """One phantom head in a BIDS folder with a DOI, preprocessed with fast settings."""
    root = tmp_path_factory.mktemp("bidsrun")
    anat = root / "raw" / "sub-01" / "ses-M000" / "anat"
    anat.mkdir(parents=True)
    head = synthetic_head(rotation_deg=(3.0, 0.0, -4.0), translation_mm=(2.0, -3.0, 1.0),
                          seed=4)
    nib.save(nib.Nifti1Image(head.data, head.affine), str(anat / "sub-01_ses-M000_T1w.nii.gz"))
    (root / "raw" / "dataset_description.json").write_text(json.dumps(
        {"Name": "phantom", "BIDSVersion": "1.9.0", "DatasetDOI": DOI}))
    cfg = load_config(None, FAST)
    summary = run_preprocessing(root / "raw", root / "out", cfg, progress=False)
    assert list(summary.status) == ["done"], summary.error.tolist()
    return root / "out", summary, cfg


def test_preprocess_writes_sMRIPrep_names_and_a_dataset_description(preprocessed) -> None:
    out, summary, cfg = preprocessed
    space = f"space-{TEMPLATE}_res-3mm"
    anat = out / "sub-01" / "ses-M000" / "anat"
    expected = {f"sub-01_ses-M000_{n}" for n in (
        f"{space}_desc-preproc_T1w.nii.gz", f"{space}_desc-preproc_T1w.json",
        f"{space}_desc-brain_mask.nii.gz", f"{space}_desc-brain_mask.json",
        "desc-brain_mask.nii.gz", "desc-brain_mask.json",
        f"{space}_label-CBM_mask.nii.gz", f"{space}_label-CBM_mask.json",
        "label-CBM_mask.nii.gz", "label-CBM_mask.json",
        f"from-T1w_to-{TEMPLATE}_mode-image_xfm.mat")}
    assert {p.name for p in anat.iterdir()} == expected
    assert [p.name for p in (out / "sub-01" / "figures").iterdir()] == [
        "sub-01_ses-M000_desc-qc_T1w.png"]
    # summary.csv stays, naming the volume; the README's `find -name '*preproc*.nii.gz'`
    # finds it and nothing else
    volume = anat / f"sub-01_ses-M000_{space}_desc-preproc_T1w.nii.gz"
    assert summary.preprocessed_path[0] == str(volume)
    assert pd.read_csv(out / "summary.csv").preprocessed_path[0] == str(volume)
    assert [p for p in out.rglob("*preproc*.nii.gz")] == [volume]
    # train finds the settings that made a manifest's volumes (and copies them to RUN)
    from adni_pu.workflows.volume_data import find_preprocess_config

    assert find_preprocess_config([volume]) == out / "preprocess_config.toml"

    desc = json.loads((out / "dataset_description.json").read_text())
    version = tuple(int(x) for x in desc["BIDSVersion"].split("."))
    assert desc["DatasetType"] == "derivative" and version >= (1, 4, 0)
    assert desc["GeneratedBy"][0]["Name"] == "adni-pu" and desc["GeneratedBy"][0]["Version"]
    assert desc["SourceDatasets"] == [{"DOI": DOI, "URL": (out.parent / "raw").as_uri(),
                                       "Version": "BIDS 1.9.0"}]
    side = json.loads(volume.with_name(volume.name.replace(".nii.gz", ".json")).read_text())
    assert side["SkullStripped"] is True and side["CerebellumRemoved"] is True
    assert "Cerebelum_*" in side["CerebellumDescription"]
    assert "percentile" in side["IntensityNormalization"]
    assert side["Resolution"] == {"3mm": side["Resolution"]["3mm"]}
    assert "61 x 73 x 61" in side["Resolution"]["3mm"]
    # the scan's record (resume reads it) is the same file
    assert side["status"] == "done" and side["settings_hash"] and side["input_sha256"]
    assert set(side["outputs"].values()) == {
        p.relative_to(out).as_posix() for p in [*anat.iterdir(), *(out / "sub-01").rglob("*.png")]}
    native = json.loads((anat / "sub-01_ses-M000_desc-brain_mask.json").read_text())
    assert native["Type"] == "Brain" and "input's own space" in native["Description"]


def test_pybids_finds_every_output_by_its_entities(preprocessed) -> None:
    bids = pytest.importorskip("bids", reason="pybids is in the dev extra")
    from bids.layout import Query

    out, _, _ = preprocessed
    layout = bids.BIDSLayout(str(out), validate=False, is_derivative=True)
    common = {"subject": "01", "session": "M000", "return_type": "filename"}

    def one(**entities) -> str:
        found = layout.get(**common, **entities)
        assert len(found) == 1, (entities, found)
        return Path(found[0]).name

    grid = {"space": TEMPLATE, "res": "3mm"}
    assert one(**grid, desc="preproc", suffix="T1w", extension=".nii.gz").endswith(
        "_desc-preproc_T1w.nii.gz")
    assert one(**grid, desc="brain", suffix="mask", extension=".nii.gz")
    assert one(space=Query.NONE, desc="brain", suffix="mask", extension=".nii.gz") == (
        "sub-01_ses-M000_desc-brain_mask.nii.gz")
    assert one(**grid, label="CBM", suffix="mask", extension=".nii.gz")
    assert one(space=Query.NONE, label="CBM", suffix="mask", extension=".nii.gz")
    assert one(suffix="xfm", extension=".mat", mode="image", to=TEMPLATE,
               **{"from": "T1w"}).endswith("_xfm.mat")
    assert one(desc="qc", suffix="T1w", extension=".png")
    volume = layout.get(**common, **grid, desc="preproc", suffix="T1w",
                        extension=".nii.gz")[0]
    meta = layout.get_metadata(volume)
    assert meta["SkullStripped"] is True and meta["CerebellumRemoved"] is True
    # the SyN warp, written only with registration.transform=syn, parses the same way
    from bids.layout import parse_file_entities

    warp = parse_file_entities(scan_names("01", "M000", "3mm")["warp"],
                               config=["bids", "derivatives"])
    assert (warp["from"], warp["to"], warp["mode"], warp["desc"], warp["suffix"],
            warp["extension"]) == ("T1w", TEMPLATE, "image", "syn", "xfm", ".nii.gz")


def test_the_preprocessing_output_passes_the_bids_validator(preprocessed) -> None:
    out, _, _ = preprocessed
    errors, _ = _validate(out)
    assert errors == [], _shown(errors)


def test_synthetic_raw_bids_passes_the_bids_validator(tmp_path: Path) -> None:
    from adni_pu.synth import SynthConfig, generate_cohort

    cohort = generate_cohort(tmp_path / "synth", n_subjects=3, seed=1, config=SynthConfig(
        voxel_size=4.0, pet=True, pet_fraction=1.0, visit_probabilities=(0.0, 1.0, 0.0)))
    errors, warnings = _validate(cohort.bids_dir)
    assert errors == [], _shown(errors)
    # the warnings left are acquisition details a synthetic scan does not have
    codes = {i["code"] for i in warnings}
    assert codes <= {"SIDECAR_KEY_RECOMMENDED", "JSON_KEY_RECOMMENDED", "NO_AUTHORS",
                     "TOO_FEW_AUTHORS"}, _shown(warnings)
    pets = list((cohort.bids_dir / "derivatives" / "synth-pet").rglob("*_pet.nii.gz"))
    assert pets and all("_desc-suvr_" in p.name for p in pets)


def test_every_name_is_one_file_per_kind_and_grid() -> None:
    names = scan_names("01", "M000", res_label(1.5))
    assert res_label(1.5) == "1p5mm" and res_label(2) == "2mm"
    assert set(names) == set(NAMES) and len(set(names.values())) == len(names)
    assert names["preproc"] == ("sub-01/ses-M000/anat/sub-01_ses-M000_space-MNI152NLin2009aSym"
                                "_res-1p5mm_desc-preproc_T1w.nii.gz")
    assert [k for k, v in names.items() if "preproc" in v and v.endswith(".nii.gz")] == [
        "preproc"]


def test_the_description_is_written_once_and_keeps_earlier_sources(tmp_path: Path) -> None:
    first = [{"URL": "file:///data/a"}]
    path = write_description(tmp_path, first)
    stamp = path.stat()
    write_description(tmp_path, first)  # a second shard: same bytes, not rewritten
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (stamp.st_ino, stamp.st_mtime_ns)
    write_description(tmp_path, [{"URL": "file:///data/b"}])
    assert json.loads(path.read_text())["SourceDatasets"] == [
        {"URL": "file:///data/a"}, {"URL": "file:///data/b"}]
    ignore = (tmp_path / ".bidsignore").read_text().splitlines()
    assert "summary.csv" in ignore and len(ignore) == len(set(ignore))


# ------------------------------------------------------------------ the earlier layout

OLD = {"preproc": "T1w_preproc.nii.gz", "brainmask_native": "brainmask_native.nii.gz",
       "affine": "affine.mat", "qc": "qc.png"}


def _fake_steps(calls: list):
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.new("L", (8, 6), 128).save(png, format="PNG")

    def fake(scan, paths, config, timings):
        calls.append(scan.subject_id)
        return ({paths["preproc"]: b"volume", paths["brainmask_native"]: b"mask",
                 paths["affine"]: b"mat", paths["qc"]: png.getvalue()}, "done", [],
                {"qc": {"brain_volume_ml": 1200.0}})
    return fake


def _old_folder(tmp_path: Path, monkeypatch) -> tuple[Path, Path, list[str]]:
    """A folder as an earlier adni-pu wrote it: made by today's code with the fast fake
    steps, then laid out with the earlier names and record (same content)."""
    calls: list[str] = []
    monkeypatch.setattr(pipe, "_run_steps", _fake_steps(calls))
    raw = tmp_path / "sub-s1_ses-01_T1w.nii.gz"
    raw.write_bytes(b"head")
    out = tmp_path / "prep"
    cfg = load_config(None, ["runner.progress=false"])
    run_preprocessing([raw], out, cfg)
    paths = output_paths(Scan("s1", "01", raw), out, cfg)
    side = json.loads(paths["sidecar"].read_text())
    folder = out / "sub-s1" / "ses-01"
    for kind, suffix in OLD.items():
        paths[kind].rename(folder / f"sub-s1_ses-01_{suffix}")
    side = {k: v for k, v in side.items() if k[0].islower()}  # no BIDS fields then
    side["outputs"] = {k: f"sub-s1_ses-01_{v}" for k, v in {**OLD, "sidecar": "sidecar.json"}
                       .items()}
    (folder / "sub-s1_ses-01_sidecar.json").write_text(json.dumps(side))
    shutil.rmtree(folder / "anat")
    shutil.rmtree(out / "sub-s1" / "figures")
    (out / "dataset_description.json").unlink()
    (out / ".bidsignore").unlink()
    summary = pd.read_csv(out / "summary.csv", dtype=str, keep_default_na=False)
    summary["preprocessed_path"] = str(folder / "sub-s1_ses-01_T1w_preproc.nii.gz")
    summary.to_csv(out / "summary.csv", index=False)
    calls.clear()
    return out, raw, calls


def test_an_old_layout_folder_is_refused_in_one_line_naming_the_conversion(
        tmp_path: Path, monkeypatch) -> None:
    out, raw, calls = _old_folder(tmp_path, monkeypatch)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(OutputError) as err:
        run_preprocessing([raw], out, load_config(None, ["runner.progress=false"]))
    text = str(err.value)
    assert "\n" not in text and f"adni-pu preprocess --convert-layout {out}" in text
    assert "sub-s1/ses-01/sub-s1_ses-01_T1w_preproc.nii.gz" in text
    assert calls == [] and sorted(p.relative_to(out) for p in out.rglob("*")) == before
    # the readers of such a folder still read it: the QC contact sheet, and summary.csv's
    # paths (what cohort build reads) name files that are there
    from adni_pu.preprocessing import contact_sheet

    sheet, _ = contact_sheet(out)
    assert sheet.is_file()
    old_volume = pd.read_csv(out / "summary.csv").preprocessed_path[0]
    assert Path(old_volume).is_file() and old_volume.endswith("_T1w_preproc.nii.gz")


def test_convert_layout_renames_in_place_and_the_rerun_redoes_nothing(
        tmp_path: Path, monkeypatch) -> None:
    out, raw, calls = _old_folder(tmp_path, monkeypatch)
    old = out / "sub-s1" / "ses-01"
    # a conversion cut short earlier: one file already carries its new name
    new = scan_names("s1", "01", "1p5mm")
    (out / new["qc"]).parent.mkdir(parents=True)
    (old / "sub-s1_ses-01_qc.png").rename(out / new["qc"])
    result = CliRunner().invoke(app, ["preprocess", "--convert-layout", str(out)])
    assert result.exit_code == 0, result.output
    assert f"converted 1 scan(s) in {out}" in result.output and "3 files renamed" in result.output
    assert "cohort build" in result.output
    assert sorted(p.name for p in old.iterdir()) == ["anat"]  # nothing left by an old name
    for kind in ("preproc", "brainmask_native", "affine", "qc", "sidecar",
                 "brainmask_native_json"):
        assert (out / new[kind]).is_file(), kind
    assert (out / new["preproc"]).read_bytes() == b"volume"
    side = json.loads((out / new["sidecar"]).read_text())
    assert side["SkullStripped"] is True and side["outputs"]["qc"] == new["qc"]
    assert json.loads((out / "dataset_description.json").read_text())["SourceDatasets"] == [
        {"URL": raw.as_uri()}]
    summary = pd.read_csv(out / "summary.csv")
    assert summary.preprocessed_path[0] == str(out / new["preproc"])
    # resumes as usual: the scan is not processed again
    again = run_preprocessing([raw], out, load_config(None, ["runner.progress=false"]))
    assert list(again.status) == ["skipped"] and calls == []
    twice = CliRunner().invoke(app, ["preprocess", "--convert-layout", str(out)])
    assert twice.exit_code == 0 and "nothing to convert" in twice.output


def test_convert_layout_refuses_an_unreadable_record_and_renames_nothing(
        tmp_path: Path, monkeypatch) -> None:
    out, _, _ = _old_folder(tmp_path, monkeypatch)
    record = out / "sub-s1" / "ses-01" / "sub-s1_ses-01_sidecar.json"
    record.write_text("{not json")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    result = CliRunner().invoke(app, ["preprocess", "--convert-layout", str(out)])
    assert result.exit_code == 2
    assert str(record) in result.output and "nothing was renamed" in result.output
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    both = CliRunner().invoke(app, ["preprocess", "in", str(out), "--convert-layout", str(out)])
    assert both.exit_code == 2 and "takes no INPUT" in both.output


def _cohort_inputs(out: Path) -> list[str]:
    """A clinical table for the folder's one subject; the cohort build arguments."""
    clinical = out.parent / "ADNIMERGE.csv"
    clinical.write_text("RID,PTID,VISCODE,EXAMDATE,DX_bl,DX,AV45\n"
                        "1,s1,bl,2010-01-10,AD,Dementia,1.3\n")
    return ["cohort", "build", str(clinical), str(out / "summary.csv")]


def test_convert_layout_stopped_after_its_last_rename_is_finished_by_the_rerun(
        tmp_path: Path, monkeypatch) -> None:
    """A kill after the last rename (every scan renamed, no
    dataset_description.json, summary.csv naming the old files) is finished by the rerun,
    which also removes the temporary files a kill leaves."""
    from adni_pu.preprocessing import legacy_layout

    out, raw, calls = _old_folder(tmp_path, monkeypatch)
    new = scan_names("s1", "01", "1p5mm")

    def killed(*args):
        raise KeyboardInterrupt  # stands for kill -9: nothing after the renames runs

    with monkeypatch.context() as patch:
        patch.setattr(legacy_layout, "_rewrite_summaries", killed)
        with pytest.raises(KeyboardInterrupt):
            legacy_layout.convert_layout(out)
    assert (out / new["preproc"]).is_file() and not (out / "dataset_description.json").exists()
    assert not Path(pd.read_csv(out / "summary.csv").preprocessed_path[0]).exists()
    journal = json.loads((out / legacy_layout.JOURNAL).read_text())
    assert ["sub-s1/ses-01/sub-s1_ses-01_T1w_preproc.nii.gz", new["preproc"]] in journal["renames"]
    # a cohort built on that summary lists no missing file: all are missing, so it is refused
    cut = CliRunner().invoke(app, [*_cohort_inputs(out), str(tmp_path / "coh")])
    assert cut.exit_code == 2 and "no usable scans left (scan_file_missing (1))" in cut.output
    assert not (tmp_path / "coh" / "manifest.csv").exists()
    refused = CliRunner().invoke(app, ["preprocess", str(raw), str(out)])
    assert refused.exit_code == 2 and "a conversion to BIDS derivatives names was stopped" \
        in refused.output and calls == []
    left = out / new["sidecar"]
    tmp = left.parent / f".{left.name}.k2x_9abc.tmp"
    tmp.write_text("{half")
    result = CliRunner().invoke(app, ["preprocess", "--convert-layout", str(out)])
    assert result.exit_code == 0, result.output
    assert "finished a conversion" in result.output and "removed 1 temporary" in result.output
    assert not tmp.exists() and not (out / legacy_layout.JOURNAL).exists()
    assert pd.read_csv(out / "summary.csv").preprocessed_path[0] == str(out / new["preproc"])
    assert (out / "dataset_description.json").is_file()
    again = run_preprocessing([raw], out, load_config(None, ["runner.progress=false"]))
    assert list(again.status) == ["skipped"] and calls == []
    from adni_pu.cohort import build_cohort, load_cohort_config

    args = _cohort_inputs(out)
    built = build_cohort(args[2], args[3], load_cohort_config())
    assert list(built.manifest.scan_path) == [str(out / new["preproc"])]


def test_convert_layout_cut_short_by_a_version_without_a_journal_is_finished(
        tmp_path: Path, monkeypatch) -> None:
    out, _, _ = _old_folder(tmp_path, monkeypatch)
    old_volume = pd.read_csv(out / "summary.csv").preprocessed_path[0]
    assert CliRunner().invoke(app, ["preprocess", "--convert-layout", str(out)]).exit_code == 0
    (out / "dataset_description.json").unlink()  # the state such a kill left
    summary = pd.read_csv(out / "summary.csv", dtype=str, keep_default_na=False)
    summary["preprocessed_path"] = old_volume
    summary.to_csv(out / "summary.csv", index=False)
    result = CliRunner().invoke(app, ["preprocess", "--convert-layout", str(out)])
    assert result.exit_code == 0, result.output
    assert "finished a conversion" in result.output
    assert Path(pd.read_csv(out / "summary.csv").preprocessed_path[0]).is_file()
    assert (out / "dataset_description.json").is_file()


def test_convert_layout_of_a_file_says_it_is_a_file(tmp_path: Path) -> None:
    table = tmp_path / "ADNIMERGE.csv"
    table.write_text("RID\n1\n")
    result = CliRunner().invoke(app, ["preprocess", "--convert-layout", str(table)])
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: {table}: is a file; expected the output folder "
                                     "of adni-pu preprocess (the folder that holds summary.csv)")
    assert table.read_text() == "RID\n1\n"


@pytest.mark.parametrize("umask", [0o002, 0o077])
def test_preprocess_and_convert_layout_outputs_get_the_umasks_mode(
        tmp_path: Path, monkeypatch, umask: int) -> None:
    """Every file and folder preprocess and --convert-layout write (summary, sidecars,
    volumes, the journal's successors) has the mode the umask gives."""
    old = os.umask(umask)
    try:
        out, raw, _ = _old_folder(tmp_path, monkeypatch)  # preprocess, then the old names
        preprocessed = {p: p.stat().st_mode & 0o7777 for p in [out, *out.rglob("*")]}
        result = CliRunner().invoke(app, ["preprocess", "--convert-layout", str(out)])
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    converted = {p: p.stat().st_mode & 0o7777 for p in [out, *out.rglob("*")]}
    for modes in (preprocessed, converted):
        for path, mode in modes.items():
            expected = (0o777 if path.is_dir() else 0o666) & ~umask
            assert mode == expected, (path, oct(mode))
