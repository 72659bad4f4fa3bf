"""A small synthetic ADNI download (the example tree of docs/preprocessing.md) for the tests.

``ADNI/<PTID>/<series description>/<date_time>/<image ID>/`` holding tiny NIfTI files or a
tiny DICOM series (written with pydicom), with the series descriptions of real ADNI
downloads: T1 scans to keep, a repeat and a corrected copy of one visit, and series that
are not T1 (localiser, calibration, FLAIR, field map).
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np

SHAPE = (40, 44, 36)
SPACING = 3.0

#: (PTID, series folder, date_time folder, image ID, format, expected status, session)
TREE: list[tuple[str, str, str, str, str, str, str]] = [
    ("011_S_0002", "3_Plane_Localizer", "2011-05-02_13_40_02.0", "I238620", "nii", "not-t1",
     "20110502"),
    ("011_S_0002", "MPRAGE", "2011-05-02_13_45_10.0", "I238623", "nii", "extra-t1",
     "20110502"),
    ("011_S_0002", "MPRAGE_Repeat", "2011-05-02_13_52_31.0", "I238624", "nii", "extra-t1",
     "20110502"),
    ("011_S_0002", "MT1__GradWarp__N3m", "2011-05-02_13_45_10.0", "I240001", "nii", "done",
     "20110502"),
    ("011_S_0002", "Axial_T2-FLAIR", "2011-05-02_14_01_10.0", "I238625", "nii", "not-t1",
     "20110502"),
    ("011_S_0002", "Accelerated_Sagittal_MPRAGE", "2012-05-10_09_12_00.0", "I300001", "dcm",
     "done", "20120510"),
    ("011_S_0002", "B1-Calibration_Body", "2012-05-10_09_05_00.0", "I300000", "dcm", "not-t1",
     "20120510"),
    ("002_S_0295", "MPR__GradWarp__B1_Correction__N3__Scaled", "2006-04-18_08_20_30.0",
     "I45108", "nii", "done", "20060418"),
    ("002_S_0295", "MPR-R__GradWarp__B1_Correction__N3__Scaled", "2006-04-18_08_20_30.0",
     "I45117", "nii", "extra-t1", "20060418"),
    ("002_S_0295", "Field_Mapping", "2006-04-18_08_10_00.0", "I45100", "nii", "not-t1",
     "20060418"),
]


def head_volume(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A small bright ball in noise: readable and valid as a scan, cheap to write."""
    rng = np.random.default_rng(seed)
    grid = np.meshgrid(*[np.linspace(-1, 1, n) for n in SHAPE], indexing="ij")
    ball = np.sqrt(sum(g**2 for g in grid)) < 0.7
    data = np.where(ball, 400.0, 10.0) + rng.normal(0, 2, SHAPE)
    return data.astype(np.int16), np.diag([SPACING, SPACING, SPACING, 1.0])


def write_dicom_series(folder: Path, data: np.ndarray, affine: np.ndarray, uid: str) -> None:
    """``data`` (x, y, z) with a diagonal RAS ``affine`` as one axial DICOM file per z slice
    (``slice001.dcm``, ...): the writer of ``adni-pu synth --format dicom``."""
    from adni_pu.synth.adni_download import write_dicom_series as write

    write(folder, np.asarray(data).astype(np.int16), affine, uid,
          lambda k: f"slice{k + 1:03d}.dcm")


def make_adni_tree(root: Path) -> Path:
    """Write :data:`TREE` under ``root/ADNI`` (plus IDA's metadata XML beside it); returns it."""
    adni = root / "ADNI"
    for n, (ptid, series, when, image, fmt, _status, _ses) in enumerate(TREE):
        folder = adni / ptid / series / when / image
        data, affine = head_volume(n)
        if fmt == "dcm":
            write_dicom_series(folder, data, affine, f"1.2.826.0.1.3680043.9.7{n}")
        else:
            folder.mkdir(parents=True, exist_ok=True)
            stamp = when.replace("-", "").replace("_", "")[:14]
            name = f"ADNI_{ptid}_MR_{series}_br_raw_{stamp}_1_S{n}_{image}.nii"
            nib.save(nib.Nifti1Image(data, affine), str(folder / name))
    (root / f"ADNI_{TREE[0][0]}_metadata.xml").write_text("<idaxs/>")
    return adni
