"""Input discovery, reading and validation of T1 scans (no registration, seconds in all)."""

from __future__ import annotations

import gzip
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from adni_pu.preprocessing.config import ValidationSettings
from adni_pu.preprocessing.io import (
    Scan,
    ScanError,
    discover_scans,
    from_canonical,
    load_scan,
    read_scan_list_csv,
    to_canonical,
    write_outputs,
)


def _head(shape=(40, 48, 40), spacing=3.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    grid = np.meshgrid(*[np.linspace(-1, 1, n) for n in shape], indexing="ij")
    r = np.sqrt(sum(g**2 for g in grid))
    data = np.where(r < 0.7, 100.0, 0.0) + rng.normal(0, 1, shape)
    return data.astype(np.float32), np.diag([spacing, spacing, spacing, 1.0])


def _save(path: Path, data: np.ndarray, affine: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(data, affine), str(path))
    return path


def test_discover_bids_with_and_without_sessions(tmp_path: Path) -> None:
    d, a = _head()
    _save(tmp_path / "sub-001/ses-M000/anat/sub-001_ses-M000_T1w.nii.gz", d, a)
    _save(tmp_path / "sub-001/ses-M012/anat/sub-001_ses-M012_T1w.nii.gz", d, a)
    _save(tmp_path / "sub-002/anat/sub-002_T1w.nii", d, a)
    _save(tmp_path / "sub-002/anat/sub-002_FLAIR.nii.gz", d, a)  # not a T1w: ignored
    scans = discover_scans(tmp_path)
    got = sorted((s.subject_id, s.session_id) for s in scans)
    assert got == [("001", "M000"), ("001", "M012"), ("002", "01")]


def test_discover_flat_folder_csv_list_and_single_file(tmp_path: Path) -> None:
    d, a = _head()
    p1 = _save(tmp_path / "flat/011_S_0002.nii.gz", d, a)
    _save(tmp_path / "flat/subj2.nii", d, a)
    (tmp_path / "flat/notes.txt").write_text("not a scan")
    scans = discover_scans(tmp_path / "flat")
    assert [s.subject_id for s in scans] == ["011_S_0002", "subj2"]
    assert scans[0].label == "sub-011S0002_ses-01"

    csv = tmp_path / "list.csv"
    csv.write_text("subject,session,path\n011_S_0002,bl,flat/011_S_0002.nii.gz\nX,m06,/abs/x.nii\n")
    scans = discover_scans(csv)
    assert scans[0] == Scan("011_S_0002", "bl", tmp_path / "flat/011_S_0002.nii.gz")
    assert scans[1].path == Path("/abs/x.nii") and scans[1].session_id == "m06"

    assert discover_scans(p1)[0].subject_id == "011_S_0002"
    assert discover_scans([p1, Scan("a", "b", p1)])[1].label == "sub-a_ses-b"


def test_flat_folder_with_a_sub_prefixed_file_is_not_bids(tmp_path: Path) -> None:
    d, a = _head()
    _save(tmp_path / "flat/sub-01_T1w.nii.gz", d, a)
    _save(tmp_path / "flat/scanB.nii.gz", d, a)
    (tmp_path / "flat/sub-02").mkdir()  # a sub-* folder without anat/ data is not BIDS either
    scans = discover_scans(tmp_path / "flat")
    assert [s.subject_id for s in scans] == ["scanB", "01"]  # its BIDS-style name still counts
    _save(tmp_path / "flat/sub-03/anat/sub-03_T1w.nii.gz", d, a)
    assert [s.subject_id for s in discover_scans(tmp_path / "flat")] == ["03"]


def test_csv_dates_image_ids_and_series_are_kept(tmp_path: Path) -> None:
    csv = tmp_path / "list.csv"
    csv.write_text("subject,session,path,acquisition_date,image_id,series_description\n"
                   "011_S_0002,bl,a.nii,5/2/2011,I238623,MPRAGE\n"
                   "011_S_0003,bl,b.nii,2011-05-03 10:00:00,,\n")
    first, second = discover_scans(csv)
    assert (first.acquisition_date, first.image_id, first.series_description) == (
        "2011-05-02", "I238623", "MPRAGE")
    assert (second.acquisition_date, second.image_id) == ("2011-05-03", "")
    csv.write_text("subject,path,scan_date\nX,a.nii,2011-13-45\n")
    with pytest.raises(ScanError, match=r"line 2: column scan_date: expected a date.*2011-13-45"):
        discover_scans(csv)


def test_discovery_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ScanError, match="not found"):
        discover_scans(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ScanError, match="found no scans"):
        discover_scans(tmp_path / "empty")
    bad = tmp_path / "bad.csv"
    bad.write_text("who,where\na,b\n")
    with pytest.raises(ScanError, match="expected columns"):
        discover_scans(bad)
    d, a = _head()
    p = _save(tmp_path / "x.nii.gz", d, a)
    with pytest.raises(ScanError, match="same output"):
        discover_scans([Scan("a_1", "1", p), Scan("a1", "1", p)])


def test_dicom_series_is_discovered_and_read(tmp_path: Path) -> None:
    import SimpleITK as sitk

    d, _ = _head(shape=(40, 44, 36))
    vol = sitk.GetImageFromArray(np.transpose(d.astype(np.int16), (2, 1, 0)))
    vol.SetSpacing((3.0, 3.0, 3.0))
    folder = tmp_path / "dicom/PATIENT1/SERIES1"
    folder.mkdir(parents=True)
    writer = sitk.ImageFileWriter()
    writer.KeepOriginalImageUIDOn()
    uid = "1.2.826.0.1.3680043.2.1125.1"
    for k in range(vol.GetDepth()):
        sl = vol[:, :, k]
        sl.SetMetaData("0020|000e", uid + ".2")  # series instance UID
        sl.SetMetaData("0020|000d", uid + ".3")
        sl.SetMetaData("0008|0060", "MR")
        sl.SetMetaData("0020|0032", "\\".join(map(str, vol.TransformIndexToPhysicalPoint((0, 0, k)))))
        sl.SetMetaData("0020|0037", "1\\0\\0\\0\\1\\0")
        sl.SetMetaData("0020|0013", str(k))
        sl.SetMetaData("0018|0050", "3.0")
        writer.SetFileName(str(folder / f"{k:03d}.dcm"))
        writer.Execute(sl)
    scans = discover_scans(tmp_path / "dicom")
    assert [(s.subject_id, s.session_id) for s in scans] == [("PATIENT1", "SERIES1")]
    data, affine = load_scan(scans[0].path)
    assert data.shape == (40, 44, 36)
    assert np.allclose(np.abs(np.diag(affine)[:3]), 3.0)
    assert np.allclose(data, np.round(d).astype(np.int16), atol=1)


@pytest.mark.parametrize(
    "kind, message",
    [
        ("truncated", "cannot read as NIfTI"),
        ("text", "cannot read as NIfTI"),
        ("2d", "expected a 3D volume"),
        ("nan", "NaN"),
        ("empty", "constant volume"),
        ("spacing", "voxel spacing"),
        ("tiny", "voxels per axis"),
        ("4d", "expected a 3D volume"),
    ],
)
def test_bad_inputs_are_refused_with_file_expected_and_found(
    tmp_path: Path, kind: str, message: str
) -> None:
    d, a = _head()
    path = tmp_path / f"{kind}.nii.gz"
    if kind == "truncated":
        _save(path, d, a)
        raw = path.read_bytes()
        path.write_bytes(raw[: len(raw) // 2])
    elif kind == "text":
        path.write_bytes(gzip.compress(b"hello, I am not a NIfTI file" * 20))
    elif kind == "2d":
        _save(path, d[:, :, 0], a)
    elif kind == "nan":
        d[3, 3, 3] = np.nan
        _save(path, d, a)
    elif kind == "empty":
        _save(path, np.zeros_like(d), a)
    elif kind == "spacing":
        _save(path, d, np.diag([30.0, 30.0, 30.0, 1.0]))
    elif kind == "tiny":
        _save(path, d[:8], a)
    elif kind == "4d":
        _save(path, np.stack([d, d], axis=-1), a)
    with pytest.raises(ScanError) as info:
        load_scan(path, ValidationSettings())
    assert str(path) in str(info.value)
    assert message in str(info.value)


def test_singleton_4d_is_accepted_and_orientation_round_trips(tmp_path: Path) -> None:
    d, a = _head(shape=(30, 36, 40))
    # LPI-like affine with permuted axes: voxel i -> -y, j -> z, k -> -x
    aff = np.array([[0, 0, -3.0, 50], [-3.0, 0, 0, 60], [0, 3.0, 0, -40], [0, 0, 0, 1]])
    p = _save(tmp_path / "four.nii.gz", d[..., None], aff)
    data, affine = load_scan(p)
    assert data.shape == (30, 36, 40)
    can, caff = to_canonical(data, affine)
    assert nib.aff2axcodes(caff) == ("R", "A", "S")
    # the same world point holds the same value on both grids
    ijk = np.array([5, 7, 9, 1])
    world = affine @ ijk
    cijk = np.round(np.linalg.inv(caff) @ world).astype(int)
    assert data[5, 7, 9] == can[cijk[0], cijk[1], cijk[2]]
    assert np.array_equal(from_canonical(can, caff, affine), data)


def test_write_outputs_is_all_or_nothing(tmp_path: Path, monkeypatch) -> None:
    import adni_pu.preprocessing.io as pio

    files = {tmp_path / "a.txt": b"a", tmp_path / "b.txt": b"b", tmp_path / "c.txt": b"c"}
    real = pio.write_file_atomic
    calls = {"n": 0}

    def flaky(path, data):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(pio, "write_file_atomic", flaky)
    with pytest.raises(OSError, match="No space"):
        write_outputs(files, last=[tmp_path / "a.txt"])
    assert list(tmp_path.iterdir()) == []  # no final files, no temporary files
    monkeypatch.setattr(pio, "write_file_atomic", real)
    write_outputs(files)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt", "c.txt"]


def _series(folder: Path) -> Path:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from adni_tree import write_dicom_series

    data = np.random.default_rng(0).normal(100, 10, (20, 22, 18)).astype(np.int16)
    write_dicom_series(folder, data, np.diag([4.0, 4.0, 4.0, 1.0]), "1.2.826.0.1.3680043.9.71")
    return folder


@pytest.mark.parametrize("damage, message", [
    ("missing", r"slice005.dcm and slice007.dcm are 8 mm apart; expected even spacing of 4 mm, "
                r"about 1 missing slice"),
    ("duplicate", r"slice006.dcm and slice006b.dcm have the same position"),
    ("truncated", r"1 of 18 slice files cannot be read as part of it \(slice006.dcm\)"),
])
def test_damaged_dicom_series_are_refused_before_conversion(tmp_path: Path, damage: str,
                                                            message: str) -> None:
    import shutil

    folder = _series(tmp_path / "s")
    assert load_scan(folder)[0].shape == (20, 22, 18)  # the undamaged series reads
    one = folder / "slice006.dcm"
    if damage == "missing":
        one.unlink()
    elif damage == "duplicate":
        shutil.copy(one, folder / "slice006b.dcm")
    else:
        one.write_bytes(one.read_bytes()[: one.stat().st_size // 2])
    with pytest.raises(ScanError, match=message):
        load_scan(folder)


def test_bids_style_names_in_a_flat_folder_give_the_bids_subject_and_session(
        tmp_path: Path) -> None:
    d, a = _head()
    for name in ("sub-colin27_T1w.nii.gz", "sub-002_ses-M12_run-2_T1w.nii", "plain_scan.nii.gz"):
        _save(tmp_path / "flat" / name, d, a)
    found = {(s.subject_id, s.session_id, s.path.name) for s in discover_scans(tmp_path / "flat")}
    assert found == {("colin27", "01", "sub-colin27_T1w.nii.gz"),
                     ("002", "M12run2", "sub-002_ses-M12_run-2_T1w.nii"),
                     ("plain_scan", "01", "plain_scan.nii.gz")}
    one = discover_scans(tmp_path / "flat" / "sub-colin27_T1w.nii.gz")[0]
    assert (one.subject_id, one.label) == ("colin27", "sub-colin27_ses-01")
    assert discover_scans([tmp_path / "flat" / "sub-colin27_T1w.nii.gz"])[0].subject_id == "colin27"


def test_discovery_modules_form_no_import_circle() -> None:
    """scans is a leaf; adni_layout reads scan records from it, never from io (issue 24)."""
    import ast

    import adni_pu.preprocessing as prep

    def relative_imports(name: str) -> set[str]:
        tree = ast.parse((Path(prep.__file__).parent / f"{name}.py").read_text())
        return {node.module or "" for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.level == 1}

    assert relative_imports("scans") == set()
    assert "io" not in relative_imports("adni_layout")
    assert {"scans", "adni_layout"} <= relative_imports("io")
    assert prep.Scan is __import__("adni_pu.preprocessing.scans", fromlist=["Scan"]).Scan


# ------------------------------------------------------------ subjects without letters or digits


@pytest.mark.parametrize("subject", ["..", "  ", "-"])
def test_a_csv_subject_without_letters_or_digits_names_its_line(tmp_path: Path,
                                                                subject: str) -> None:
    listing = tmp_path / "scans.csv"
    listing.write_text(f"subject,path\nok1,a.nii.gz\n{subject},b.nii.gz\n")
    with pytest.raises(ScanError, match=r"scans.csv: line 3: column subject: expected an id"):
        read_scan_list_csv(listing)
    listing.write_text("subject,session,path\n患者,基线,a.nii.gz\nok,1,\n", encoding="utf-8")
    with pytest.raises(ScanError, match="line 3: column path"):
        read_scan_list_csv(listing)
