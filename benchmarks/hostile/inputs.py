"""Hostile probes: inputs (see benchmarks.hostile).

Model-grid volumes that predict and train read (findings 1, 10, 11, 12, 21), where predict
writes its table (7), and scan files whose header or name lies (17, 23). The probes that
need a trained run share one per checkout (trained once, about a minute, and copied into
each probe's folder), scoring volumes of its tiny cohort.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.integrity_probes import FAST, Probe, _last, _sets, _trained, tiny_sets

_HOMES: dict[Path, Path] = {}


def _home(p: Probe) -> Path:
    """The folder holding this checkout's tiny cohort and its trained run (made once)."""
    if p.checkout not in _HOMES:
        home = Path(tempfile.mkdtemp(prefix="adni-pu-hostile-inputs-"))
        atexit.register(shutil.rmtree, home, True)
        _trained(Probe(p.checkout, home))
        _HOMES[p.checkout] = home
    return _HOMES[p.checkout]


def _run(p: Probe) -> Path:
    """A copy of the trained run in the probe's folder."""
    shutil.copytree(_home(p) / "run", p.work / "run")
    return p.work / "run"


def _scan(p: Probe, index: int = 15) -> Path:
    return _home(p) / "cohort" / "vol" / f"sub-{index}_ses-bl_desc-preproc_T1w.nii"


def _write(p: Probe, name: str, change: str, index: int = 15) -> Path:
    """A copy of a cohort volume as float32, with ``change`` applied to its array ``d``."""
    p.py(f"""
        import nibabel as nib, numpy as np
        img = nib.load({str(_scan(p, index))!r})
        d = np.asarray(img.dataobj, dtype=np.float32)
        {change}
        nib.save(nib.Nifti1Image(d, img.affine), {name!r})
        """)
    return p.work / name


def _short(p: Probe, text: str) -> str:
    """``text`` without the probe's and the shared cohort's folders."""
    return text.replace(f"{p.work}/", "").replace(f"{_home(p)}/cohort/vol/", "")


def _predict(p: Probe, *scans: str) -> str:
    r = p.cli("predict", str(_run(p)), *scans)
    lines = [_short(p, ln)[:150] for ln in r.stdout.splitlines() if ln.strip()]
    lost = len(lines) < len(scans) or r.returncode not in (0, 1)  # a scan has no line
    return f"exit {r.returncode}; " + " | ".join(lines) \
        + (f" | stderr: {_last(r.stderr)}" if lost else "")


def nan_voxel(p: Probe) -> str:
    """1a. predict on a model-grid volume with one NaN voxel."""
    _write(p, "nan.nii.gz", "d[60, 70, 60] = np.nan")
    return _predict(p, "nan.nii.gz")


def all_zero(p: Probe) -> str:
    """1b. predict on an all-zero model-grid volume."""
    _write(p, "zero.nii.gz", "d[:] = 0")
    return _predict(p, "zero.nii.gz")


def four_d(p: Probe) -> str:
    """12. predict on a 4D model-grid file and a good scan in one call."""
    _write(p, "series.nii.gz", "d = np.stack([d, d], axis=-1)")
    return _predict(p, "series.nii.gz", str(_scan(p)))


def out_overwrites(p: Probe) -> str:
    """7. predict --out onto the run's splits.csv, a cohort manifest, a summary.csv."""
    run = _run(p)
    shutil.copy(_home(p) / "cohort" / "manifest.csv", p.work / "manifest.csv")
    (p.work / "summary.csv").write_text("subject_id,session_id,status\nA,bl,done\n")
    said = []
    for target in (run / "splits.csv", p.work / "manifest.csv", p.work / "summary.csv"):
        before = target.read_bytes()
        r = p.cli("predict", str(run), str(_scan(p)), "--out", str(target))
        kept = "kept" if target.read_bytes() == before else "REPLACED"
        said.append(f"{target.name}: exit {r.returncode}, {kept}")
    return "; ".join(said) + f" ({_short(p, _last(r.stderr))[:150]})"


def _train_with(p: Probe, scan: str) -> str:
    """train on the cohort's manifest with the training scan of sub-3 replaced by ``scan``."""
    p.py(f"""
        import pandas as pd
        from pathlib import Path
        m = pd.read_csv({str(_home(p) / "cohort" / "manifest.csv")!r}, dtype=str)
        m["scan_path"] = [str(Path({str(_home(p) / "cohort")!r}) / s) for s in m.scan_path]
        m.loc[m.scan_path.str.endswith("sub-3_ses-bl_desc-preproc_T1w.nii"), "scan_path"] = {scan!r}
        m.to_csv("manifest.csv", index=False)
        """)
    r = p.cli("train", "manifest.csv", "run2", "--preset", "naive", *tiny_sets(p))
    left = "a run folder is left" if (p.work / "run2").exists() else "no run folder"
    return f"exit {r.returncode}, {left}: {_short(p, _last(r.stderr))[:150]}"


def not_nifti(p: Probe) -> str:
    """10. train with a manifest scan_path that is /etc/passwd."""
    return _train_with(p, "/etc/passwd")


def nan_training(p: Probe) -> str:
    """11. train with a NaN voxel in one model-grid training volume."""
    return _train_with(p, str(_write(p, "nan.nii.gz", "d[60, 70, 60] = np.nan", index=3)))


def folder_scan(p: Probe) -> str:
    """21. train with a manifest scan_path that is a folder."""
    (p.work / "scan.nii.gz").mkdir()
    return _train_with(p, str(p.work / "scan.nii.gz"))


def huge_header(p: Probe) -> str:
    """17. Reading an 87-byte .nii.gz whose header claims 1000^3 float32, and one of 30000^3."""
    said = []
    for side in (1000, 30000):
        r = p.py(f"""
            import gzip, resource
            import nibabel as nib, numpy as np
            from adni_pu.preprocessing.io import load_scan
            h = nib.Nifti1Header()
            h.set_data_shape(({side}, {side}, {side}))
            h.set_data_dtype(np.float32)
            h.set_data_offset(352)
            open("huge.nii.gz", "wb").write(gzip.compress(h.binaryblock + bytes(4)))
            try:
                load_scan("huge.nii.gz")
                said = "read"
            except Exception as e:
                said = type(e).__name__ + ": " + str(e).split("huge.nii.gz: ", 1)[-1][:90]
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"peak RSS {{peak:.0f}} MB, {{said}}")
            """)
        said.append(f"{side}^3: {_last(r.stdout) or _last(r.stderr)}")
    return "; ".join(said)


def gzip_named_nii(p: Probe) -> str:
    """23. preprocess a .nii file holding gzip data."""
    (p.work / "in").mkdir()
    p.py("""
        import gzip, nibabel as nib
        from adni_pu.preprocessing.phantom import synthetic_head
        h = synthetic_head(spacing=4.0, shape=(48, 57, 48), seed=1)
        nib.save(nib.Nifti1Image(h.data, h.affine), "s.nii.gz")
        open("in/scan.nii", "wb").write(open("s.nii.gz", "rb").read())
        """)
    r = p.cli("preprocess", "in", "out", "--no-progress", *_sets(FAST))
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "scan" in ln]
    return f"exit {r.returncode}: {(lines[-1] if lines else _last(r.stderr))[:170]}"


PROBES: list[tuple[str, Callable[[Probe], str]]] = [
    ("1a predict: a model-grid volume with one NaN voxel", nan_voxel),
    ("1b predict: an all-zero model-grid volume", all_zero),
    ("7 predict --out onto splits.csv, a manifest, a summary.csv", out_overwrites),
    ("10 train: a manifest scan_path that is /etc/passwd", not_nifti),
    ("11 train: a NaN voxel in a model-grid training volume", nan_training),
    ("12 predict: a 4D model-grid file beside a good scan", four_d),
    ("17 a huge header on a tiny .nii.gz (1000^3, 30000^3 float32)", huge_header),
    ("21 train: a manifest scan_path that is a folder", folder_scan),
    ("23 preprocess: a .nii holding gzip data", gzip_named_nii),
]
