"""Hostile probes: sharing (see benchmarks.hostile): two processes into one folder, file
modes, a full disk, a read-only run, a missing GPU, Ctrl-C.

The full disk is a real one where this machine allows it: a tiny tmpfs mounted in a private
user and mount namespace (``unshare -rm``; no root needed, gone when the process ends).
Where that is refused, the probe simulates ENOSPC with a monkeypatched write and says so in
its line. The read-only run is a read-only bind mount in the same kind of namespace (root
ignores file modes), or ``chmod -R a-w`` where that is refused.
"""

from __future__ import annotations

import shlex
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

from benchmarks.integrity_probes import FAST, TINY, Probe, _last, _sets, tiny_sets

HEAD = """
import nibabel as nib
from pathlib import Path
from adni_pu.preprocessing.phantom import synthetic_head
def head(path, seed):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    h = synthetic_head(spacing=4.0, shape=(48, 57, 48), seed=seed)
    nib.save(nib.Nifti1Image(h.data, h.affine), path)
"""

MNIST = """
import sys
from pathlib import Path
from test_readers import write_mnist
from adni_pu.data import readers
readers.MNIST_COUNTS.update(train=200, test=40)
if not Path('mnist').exists():
    write_mnist(Path('mnist'), n_train=200, n_test=40)
"""


def _cli_code(*args: str, before: str = "") -> str:
    """Python that runs ``adni-pu ARGS`` (after ``before``)."""
    return (textwrap.dedent(before) + "\nimport sys\nfrom adni_pu.cli.app import main\n"
            f"sys.argv = ['adni-pu', {', '.join(repr(a) for a in args)}]\nmain()\n")


def _popen(p: Probe, code: str) -> subprocess.Popen:
    # SIGINT at its default in the child: a probe table run in the background (``nohup
    # ... &``) inherits it ignored, and Python then never raises KeyboardInterrupt
    return subprocess.Popen([sys.executable, "-c", code], cwd=p.work, env=p.env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _in_namespace(p: Probe, shell: str, code: str, timeout: float = 600
                  ) -> subprocess.CompletedProcess | None:
    """Run ``shell`` (mounts) then Python ``code`` in a private user and mount namespace;
    None where this machine refuses one."""
    script = p.work / "_probe_code.py"
    script.write_text(code)
    cmd = ["unshare", "-rm", "sh", "-c",
           f"{shell} || exit 111; exec {shlex.quote(sys.executable)} {script.name}"]
    try:
        r = subprocess.run(cmd, cwd=p.work, env=p.env, capture_output=True, text=True,
                           timeout=timeout)
    except FileNotFoundError:
        return None
    return None if r.returncode == 111 or "unshare:" in r.stderr[:200] else r


def _full_disk(p: Probe, size: str, code: str, simulated: str) -> tuple[str, Any]:
    """Run ``code`` with ``./full`` a tmpfs of ``size``; else ``simulated + code`` (a
    monkeypatched write). Returns (how, CompletedProcess)."""
    (p.work / "full").mkdir(exist_ok=True)
    r = _in_namespace(p, f"mount -t tmpfs -o size={size} tmpfs full", code)
    if r is not None:
        return f"tmpfs of {size}", r
    return "simulated ENOSPC (monkeypatched write; no tmpfs here)", p.py(
        textwrap.dedent(simulated) + code)


def _outcome(r: Any) -> str:
    tail = _last(r.stderr) or _last(r.stdout)
    kind = "traceback" if "Traceback (most recent call last)" in r.stderr else "no traceback"
    return f"exit {r.returncode}, {kind}: {tail[:150]}"


def _tiny_cohort(p: Probe) -> list[str]:
    """A tiny model-grid cohort in ``cohort/``; the --set arguments of a seconds-long run."""
    p.py(TINY + "make_volume_cohort(Path('cohort'))")
    return tiny_sets(p)


# --------------------------------------------------------------------------- 4, 8: two processes


def two_trainers(p: Probe) -> str:
    """4. Two ``train`` processes into one RUN, started together (6 epochs each)."""
    sets = [a.replace("train.epochs=1", "train.epochs=6") for a in _tiny_cohort(p)]
    args = ("train", "cohort/manifest.csv", "run", "--preset", "naive", *sets)
    procs = [_popen(p, _cli_code(*args)) for _ in range(2)]
    results = [(proc.wait(timeout=900), proc.communicate()[1]) for proc in procs]
    metrics = p.work / "run" / "metrics.csv"
    rows = len(metrics.read_text().strip().splitlines()) - 1 if metrics.is_file() else 0
    refused = [_last(err) for code, err in results if code != 0]
    return (f"exit codes {sorted(code for code, _ in results)}; metrics.csv: {rows} rows for "
            f"6 epochs" + (f"; refused: {refused[0][:150]}" if refused else ""))


def two_preprocessors(p: Probe, tries: int = 5) -> str:
    """8. Two ``preprocess`` processes into one OUTPUT, one input of one scan each, started
    together; ``tries`` times, each into a new OUTPUT. The two heads are alike (one seed),
    so the two runs take as long and finish together, when summary.csv is written."""
    p.py(HEAD + "head('in1/s1.nii.gz', 1); head('in2/s2.nii.gz', 1)")
    lost = refused = 0
    message = ""
    for i in range(tries):
        out = f"out{i}"
        procs = [_popen(p, _cli_code("preprocess", f"in{k}", out, "--no-progress",
                                     *_sets(FAST))) for k in (1, 2)]
        results = [(proc.wait(timeout=900), proc.communicate()[1]) for proc in procs]
        summary = p.work / out / "summary.csv"
        rows = len(summary.read_text().strip().splitlines()) - 1 if summary.is_file() else 0
        sidecars = len(list((p.work / out).glob("sub-*/ses-*/anat/*_desc-preproc_T1w.json")))
        if rows < sidecars:
            lost += 1
        for code, err in results:
            if code == 2 and "in use by" in err:
                refused += 1
                message = _last(err)
    line = (f"{tries} tries: summary.csv lost a scan that has a sidecar in {lost}; "
            f"the second process was refused in {refused}")
    if refused:  # the refused scan, preprocessed once the folder is free, joins the summary
        p.cli("preprocess", "in1", f"out{tries - 1}", "--no-progress", *_sets(FAST))
        p.cli("preprocess", "in2", f"out{tries - 1}", "--no-progress", *_sets(FAST))
        summary = p.work / f"out{tries - 1}" / "summary.csv"
        rows = len(summary.read_text().strip().splitlines()) - 1
        line += f" ({message[:110]}); rerun after: summary.csv lists {rows} scans"
    return line


# --------------------------------------------------------------------------- 9: modes


def file_modes(p: Probe) -> str:
    """9. preprocess under umask 022: the modes of summary.csv, the volume, the settings."""
    p.py(HEAD + "head('in/s1.nii.gz', 1)")
    r = p.py("import os\nos.umask(0o022)\n" + _cli_code("preprocess", "in", "out",
                                                         "--no-progress", *_sets(FAST)))
    files = [p.work / "out" / "summary.csv", p.work / "out" / "preprocess_config.toml",
             *sorted((p.work / "out").glob("sub-*/ses-*/anat/*_desc-preproc_T1w.nii.gz"))[:1]]
    modes = ", ".join(f"{f.name} {stat.S_IMODE(f.stat().st_mode):04o}" for f in files
                      if f.exists())
    return f"umask 022, exit {r.returncode}: {modes or 'no files'}"


# --------------------------------------------------------------------------- 13: devices


def missing_device(p: Probe) -> str:
    """13. ``benchmark --device cuda`` on a CPU-only machine, and ``--device tpu``."""
    common = ("benchmark", "mnist", "--seeds", "1", "--epochs", "1", "--n-labelled", "60",
              "--data-dir", "mnist", "--set", "progress=false")
    parts = []
    for device in ("cuda", "tpu"):
        r = p.py(_cli_code(*common, "--out", f"bm-{device}", "--device", device,
                           before=MNIST))
        parts.append(f"{device}: {_outcome(r)}")
    return "; ".join(parts)


# --------------------------------------------------------------------------- 15: a full disk

ENOSPC_CONFIG = """
import errno, pathlib
_write = pathlib.Path.write_text
def _full(self, *a, **k):
    if self.name.startswith('.preprocess_config.toml.'):
        raise OSError(errno.ENOSPC, 'No space left on device')
    return _write(self, *a, **k)
pathlib.Path.write_text = _full
"""


def full_disk_preprocess(p: Probe) -> str:
    """15a. preprocess into a full disk (ENOSPC writing preprocess_config.toml)."""
    p.py(HEAD + "head('in/s1.nii.gz', 1)")
    how, r = _full_disk(p, "4k", _cli_code("preprocess", "in", "full/out", "--no-progress",
                                           *_sets(FAST)), ENOSPC_CONFIG)
    return f"{how}: {_outcome(r)}"


ENOSPC_TORCH = """
import torch
def _full(*a, **k):
    raise RuntimeError('[enforce fail at inline_container.cc:672] . unexpected pos 36864 vs '
                       '36760')
torch.save = _full
"""


def full_disk_train(p: Probe) -> str:
    """15b. train into a folder with 148 KiB free (torch.save of the checkpoint fails)."""
    sets = _tiny_cohort(p)
    how, r = _full_disk(p, "148k", _cli_code("train", "cohort/manifest.csv", "full/run",
                                             "--preset", "naive", *sets), ENOSPC_TORCH)
    return f"{how}: {_outcome(r)}"


# --------------------------------------------------------------------------- 25: read-only


def read_only_run(p: Probe) -> str:
    """25. evaluate a second time on a run that has become read-only."""
    sets = _tiny_cohort(p)
    p.cli("train", "cohort/manifest.csv", "run", "--preset", "naive", *sets)
    first = p.cli("evaluate", "run", "--bootstrap", "20")
    if first.returncode != 0:
        return f"setup failed: {_outcome(first)}"
    code = _cli_code("evaluate", "run", "--bootstrap", "20")
    r = _in_namespace(p, "mount --bind run run && mount -o remount,bind,ro run", code)
    how = "read-only bind mount"
    if r is None:
        how = "chmod -R a-w"
        subprocess.run(["chmod", "-R", "a-w", str(p.work / "run")], check=True)
        try:
            r = p.py(code)
        finally:
            subprocess.run(["chmod", "-R", "u+w", str(p.work / "run")], check=True)
    hidden = "names a hidden temp file" if "/." in (_last(r.stderr) or "") else \
        "no hidden name"
    return f"{how}: {_outcome(r)} ({hidden})"


# --------------------------------------------------------------------------- 26: Ctrl-C


def ctrl_c_benchmark(p: Probe) -> str:
    """26. benchmark stopped by SIGINT (Ctrl-C) after its second epoch."""
    proc = _popen(p, _cli_code("benchmark", "mnist", "--seeds", "2", "--epochs", "50",
                               "--n-labelled", "60", "--data-dir", "mnist", "--out", "bm",
                               "--threads", "1", "--set", "progress=false", before=MNIST))
    seen, deadline = [], time.monotonic() + 600
    assert proc.stderr is not None
    for line in proc.stderr:  # the epoch lines come on stderr
        seen.append(line)
        if line.startswith("epoch 2/") or time.monotonic() > deadline:
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.communicate(timeout=300)[1]
    tail = _last("".join(seen) + rest)
    said = tail if "epoch " not in tail[:7] else "no message (last line: an epoch line)"
    return f"exit {proc.returncode}: {said[:200]}"


PROBES: list[tuple[str, Callable[[Probe], str]]] = [
    ("4 train: two train processes into one RUN, started together", two_trainers),
    ("8 preprocess: two preprocess processes into one OUTPUT, 5 tries", two_preprocessors),
    ("9 preprocess under umask 022: modes of the outputs", file_modes),
    ("13 benchmark --device cuda on a CPU-only machine, and --device tpu", missing_device),
    ("15a preprocess on a real full disk (a 4 KiB tmpfs, else a simulated ENOSPC)",
     full_disk_preprocess),
    ("15b train with 148 KiB free (a tmpfs, or a simulated torch.save failure)",
     full_disk_train),
    ("25 evaluate on a read-only run", read_only_run),
    ("26 benchmark stopped by SIGINT (Ctrl-C)", ctrl_c_benchmark),
]
