"""Stopping a multi-worker ``adni-pu preprocess`` with SIGINT (Ctrl-C) or SIGTERM.

The run is a real ``adni-pu preprocess --workers N`` in a subprocess; only the pipeline's
steps are replaced by a sleep (in the script's top level, which the spawned workers execute
too): 1 s for the first two scans, 60 s for the others, so when the signal arrives two scans
have finished and the others are running or queued.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

N_SCANS = 8
RECORDS = "sub-*/ses-*/anat/*_desc-preproc_T1w.json"  # each scan's record, written last

_SCRIPT = """
import sys
import time

import adni_pu.preprocessing.pipeline as pipe


def slow_steps(scan, paths, config, timings):
    time.sleep(1.0 if scan.subject_id in ("s0", "s1") else 60.0)  # s2... still run when hit
    return {paths["preproc"]: b"volume", paths["qc"]: b"png"}, "done", [], {"qc": {}}


pipe._run_steps = slow_steps  # top level: spawned workers run it as __mp_main__ too

if __name__ == "__main__":
    from adni_pu.cli.app import main

    sys.argv = ["adni-pu", "preprocess", sys.argv[1], sys.argv[2], "--workers", sys.argv[3],
                "--no-progress"]
    main()
"""


def _children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start(tmp_path: Path, workers: int) -> tuple[subprocess.Popen, Path]:
    """Start the run on N_SCANS inputs; return once two scans have finished."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(N_SCANS):
        (inputs / f"s{i}.nii.gz").write_bytes(b"not read by the replaced steps")
    script = tmp_path / "run.py"
    script.write_text(_SCRIPT)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(script), str(inputs), str(out), str(workers)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 90
    while len(list(out.glob(RECORDS))) < 2:
        if proc.poll() is not None or time.monotonic() > deadline:
            _kill(proc)
            pytest.fail(f"no two scans finished: {proc.communicate()}")
        time.sleep(0.1)
    return proc, out


def _kill(proc: subprocess.Popen) -> None:
    """Clean up after a failed test: everything left in the run's session group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _no_worker_left(workers: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while [pid for pid in workers if _alive(pid)]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


@pytest.mark.parametrize("sig, workers", [(signal.SIGINT, 2), (signal.SIGTERM, 2),
                                          (signal.SIGTERM, 1)])
def test_interrupt_stops_workers_and_writes_the_summary_of_finished_scans(
        tmp_path: Path, sig: signal.Signals, workers: int) -> None:
    proc, out = _start(tmp_path, workers)
    try:
        children = _children(proc.pid)
        assert len(children) >= workers - (workers == 1)
        # Ctrl-C reaches the terminal's whole process group; `kill PID` only the main one
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        start = time.monotonic()
        _, err = proc.communicate(timeout=20)
        assert time.monotonic() - start < 8, "did not stop promptly"
    finally:
        _kill(proc)
    assert proc.returncode == 128 + sig, err
    named = "the user (Ctrl-C)" if sig == signal.SIGINT else sig.name  # adni_pu.signals
    assert f"interrupted by {named}; " in err and "summary.csv" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert _no_worker_left(children, within=2.0), "orphaned worker"

    summary = pd.read_csv(out / "summary.csv", dtype=str)
    done = sorted(p.parents[2].name for p in out.glob(RECORDS))
    finished = summary[summary.status == "done"]
    assert len(finished) == 2 and len(summary) == N_SCANS
    assert set(summary.status) == {"done", "interrupted"}  # cut-short scans keep a row
    assert sorted("sub-" + finished.subject_id) == done
    # no half-written output: no temporary file, and every scan folder is complete or empty
    assert not list(out.rglob("*.tmp"))
    grid = "space-MNI152NLin2009aSym_res-1p5mm"
    for folder in out.glob("sub-*/ses-*/anat"):
        names = {p.name.split("_", 2)[-1] for p in folder.iterdir()}
        assert names in (set(), {f"{grid}_desc-preproc_T1w.nii.gz",
                                 f"{grid}_desc-preproc_T1w.json"}), names
        figure = folder.parents[1] / "figures" / f"{folder.parents[1].name}_ses-01_desc-qc_T1w.png"
        assert figure.is_file() == bool(names), folder


def test_workers_exit_when_the_main_process_is_killed(tmp_path: Path) -> None:
    """SIGKILL cannot be handled: the workers notice their parent is gone and exit."""
    proc, _ = _start(tmp_path, 2)
    try:
        workers = _children(proc.pid)
        assert len(workers) >= 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert _no_worker_left(workers, within=5.0), "orphaned worker"
    finally:
        _kill(proc)
