"""Hostile probes: preprocessing (see benchmarks.hostile).

A head stored with an intensity offset (finding 2), an already-preprocessed volume given
back as input (6), a full disk on the settings file (15a), names that make no label (16)
or too long a one (30a), a grid of no voxels (18), and ``qc`` on a folder that does not
exist (22). Each preprocesses synthetic 4 mm heads with the fast settings of
``benchmarks.integrity_probes``, in seconds.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from benchmarks.integrity_probes import FAST, Probe, _last, _sets

HEAD = """
import nibabel as nib, numpy as np
from adni_pu.preprocessing.phantom import synthetic_head
def head(path, seed=1, noise=0.02, scale=1.0, offset=0.0, dtype=np.float32):
    h = synthetic_head(spacing=4.0, shape=(48, 57, 48), seed=seed, noise=noise)
    data = h.data * scale + offset
    if np.dtype(dtype).kind == "i":
        data = np.round(data)
    nib.save(nib.Nifti1Image(data.astype(dtype), h.affine), path)
"""


def _preprocess(p: Probe, source: str, out: str, *extra: str):
    return p.cli("preprocess", source, out, "--no-progress", *extra, *_sets(FAST))


def _sidecar(p: Probe, out: str, subject: str) -> dict:
    import json

    found = sorted((p.work / out).glob(f"sub-{subject}/ses-*/anat/*_desc-preproc_T1w.json"))
    return json.loads(found[0].read_text()) if found else {}


def _short(text: str) -> str:
    """``text`` with runs of one letter (a 240-character name) shortened."""
    return re.sub(r"(a)\1{20,}", lambda m: f"a...({len(m.group(0))} a's)", text)


def offset_noise(p: Probe) -> str:
    """2. A noisy head (noise 15 %) and the same stored as int16 x * 10 - 3000 (its brain
    reads below 0, as Colin27's does under x * 10 - 1000)."""
    (p.work / "in").mkdir()
    p.py(HEAD + "head('in/plain.nii.gz', noise=0.15)\n"
         "head('in/shifted.nii.gz', noise=0.15, scale=10, offset=-3000, dtype=np.int16)")
    _preprocess(p, "in", "out")
    parts = []
    for name in ("plain", "shifted"):
        side = _sidecar(p, "out", name)
        qc = side.get("qc", {})
        parts.append(f"{name}: {side.get('status')}, brain_noise {qc.get('brain_noise')}, "
                     f"mask_edge_contrast {qc.get('mask_edge_contrast')}")
    return "; ".join(parts)


def offset_model_input(p: Probe) -> str:
    """2. A clean head, the same as int16 x * 10 - 3000, and as x * 10 (no offset: how much
    the registration alone answers a change of scale): the model inputs compared."""
    (p.work / "in").mkdir()
    p.py(HEAD + "head('in/plain.nii.gz')\n"
         "head('in/shifted.nii.gz', scale=10, offset=-3000, dtype=np.int16)\n"
         "head('in/scaled.nii.gz', scale=10)")
    _preprocess(p, "in", "out")
    r = p.py("""
        import glob, nibabel as nib, numpy as np
        def vol(name):
            found = glob.glob(f'out/sub-{name}/ses-01/anat/*_desc-preproc_T1w.nii.gz')
            return nib.load(found[0]).get_fdata() if found else None
        a = vol('plain')
        for name in ('shifted', 'scaled'):
            b = vol(name)
            if a is None or b is None:
                print(f'{name}: no model input;', end=' ')
                continue
            m = (a > 0) | (b > 0)
            print(f'{name}: r = {np.corrcoef(a[m], b[m])[0, 1]:.4f}, '
                  f'max |diff| {np.abs(a - b).max():.2f};', end=' ')
        """)
    return r.stdout.strip().rstrip(";") or _last(r.stderr)


def own_input(p: Probe) -> str:
    """6. An already-preprocessed volume given back as input, into its own output folder."""
    (p.work / "in").mkdir()
    p.py(HEAD + "head('in/s1.nii.gz')")
    _preprocess(p, "in", "out")
    folder = p.work / "out" / "sub-s1" / "ses-01" / "anat"
    given = next(iter(sorted(folder.glob("*_desc-preproc_T1w.nii.gz"))), folder / "none")
    before = sorted(f.name for f in folder.iterdir())
    r = _preprocess(p, str(given.relative_to(p.work)), "out")
    after = sorted(f.name for f in folder.iterdir()) if folder.is_dir() else []
    said = (r.stderr.strip().splitlines() or [""])[-1] if r.returncode == 2 else _last(
        r.stdout.split("summary:")[0])
    said = said.replace(f"{p.work.resolve()}/", "").replace(f"{p.work}/", "")
    kept = "input kept" if given.is_file() else "INPUT DELETED"
    return (f"exit {r.returncode}: {said[:210]}; {kept}, {len(after)} of {len(before)} "
            "files left")


def full_disk_settings(p: Probe) -> str:
    """15a. preprocess on a full disk: ENOSPC (no file name) writing preprocess_config.toml."""
    p.py(HEAD + "head('s1.nii.gz')")
    r = p.py("""
        import errno, pathlib, sys
        real = pathlib.Path.write_text
        def full(self, *args, **kwargs):
            if self.name.startswith('.preprocess_config.toml.'):
                raise OSError(errno.ENOSPC, 'No space left on device')
            return real(self, *args, **kwargs)
        pathlib.Path.write_text = full
        from adni_pu.cli.app import main
        sys.argv = ['adni-pu', 'preprocess', 's1.nii.gz', 'out', '--no-progress']
        main()
        """)
    traceback = "Traceback" in r.stderr
    return f"exit {r.returncode}{', traceback' if traceback else ''}: {_last(r.stderr)}"


def no_letters(p: Probe) -> str:
    """16. A folder holding 患者.nii.gz and ok1.nii.gz; a CSV whose subject is ``..``."""
    (p.work / "in").mkdir()
    p.py(HEAD + "head('in/患者.nii.gz'); head('in/ok1.nii.gz', seed=2)")
    r = _preprocess(p, "in", "out")
    said = _last(r.stderr) if r.returncode == 2 else r.stdout.splitlines()[0]
    folders = sorted(f.name for f in (p.work / "out").glob("sub-*"))
    (p.work / "scans.csv").write_text("subject,path\nok1,in/ok1.nii.gz\n..,in/ok1.nii.gz\n")
    c = _preprocess(p, "scans.csv", "out2")
    return (f"folder: exit {r.returncode}, {said[:90]}, folders {folders}; CSV '..': exit "
            f"{c.returncode}, {_last(c.stderr)[:110]}")


def grid_zero(p: Probe) -> str:
    """18. --set "grid.shape=[0,0,0]"."""
    (p.work / "in").mkdir()
    p.py(HEAD + "head('in/s1.nii.gz')")
    start = time.perf_counter()
    r = _preprocess(p, "in", "out", "--set", "grid.shape=[0,0,0]")
    took = time.perf_counter() - start
    said = _last(r.stderr) if r.returncode == 2 else " ".join(
        ln.strip() for ln in r.stdout.splitlines()[:2])
    return f"exit {r.returncode} after {took:.0f} s: {said[:150]}"


def qc_missing(p: Probe) -> str:
    """22. adni-pu qc on a folder that does not exist."""
    r = p.cli("qc", "no-such-folder")
    return f"exit {r.returncode}: {_last(r.stderr)}"


def long_name(p: Probe) -> str:
    """30a. A 240-character file name beside ok1.nii.gz."""
    (p.work / "in").mkdir()
    p.py(HEAD + f"head('in/{'a' * 240}.nii.gz'); head('in/ok1.nii.gz', seed=2)")
    start = time.perf_counter()
    r = _preprocess(p, "in", "out")
    took = time.perf_counter() - start
    failed = [ln.strip() for ln in r.stdout.splitlines() if "failed" in ln and "sub-" in ln]
    said = failed[0].split(".nii.gz: ", 1)[-1] if failed else _last(r.stderr)
    empty = [f for f in (p.work / "out").glob("sub-*/ses-*") if not any(f.iterdir())]
    return (f"exit {r.returncode} after {took:.0f} s: {_short(said)[:150]}; "
            f"{len(empty)} empty folder(s) left")


PROBES: list[tuple[str, Callable[[Probe], str]]] = [
    ("2 preprocess: a noisy head stored as int16 x*10-3000 (noise and edge QC)", offset_noise),
    ("2 preprocess: a clean head stored as int16 x*10-3000 (model input)", offset_model_input),
    ("6 preprocess: an already-preprocessed volume given back into its own folder", own_input),
    ("15a preprocess: ENOSPC on preprocess_config.toml", full_disk_settings),
    ("16 preprocess: 患者.nii.gz beside ok1.nii.gz; a CSV subject '..'", no_letters),
    ("18 preprocess: --set grid.shape=[0,0,0]", grid_zero),
    ("22 qc: a folder that does not exist", qc_missing),
    ("30a preprocess: a 240-character file name", long_name),
]
