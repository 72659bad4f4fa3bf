"""Stopping a multi-worker ``adni-pu preprocess`` with SIGINT (Ctrl-C) or SIGTERM.

The run is a real ``adni-pu preprocess --workers 2`` in a subprocess; only the pipeline's
steps are replaced by a 1.5 s sleep (in the script's top level, which the spawned workers
execute too), so the test controls which scans are running when the signal arrives.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

N_SCANS = 8

_SCRIPT = """
import sys
import time

import adni_pu.preprocessing.pipeline as pipe


def slow_steps(scan, paths, config, timings):
    time.sleep(1.5)
    return {paths["preproc"]: b"volume", paths["qc"]: b"png"}, "done", [], {"qc": {}}


pipe._run_steps = slow_steps  # top level: spawned workers run it as __mp_main__ too

if __name__ == "__main__":
    from adni_pu.cli.app import main

    sys.argv = ["adni-pu", "preprocess", sys.argv[1], sys.argv[2], "--workers", "2",
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


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_workers_and_writes_the_summary_of_finished_scans(
        tmp_path: Path, sig: signal.Signals) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    for i in range(N_SCANS):
        (inputs / f"s{i}.nii.gz").write_bytes(b"not read by the replaced steps")
    script = tmp_path / "run.py"
    script.write_text(_SCRIPT)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(script), str(inputs), str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while len(list(out.glob("sub-*/ses-*/*_sidecar.json"))) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no scan finished in 90 s"
            time.sleep(0.1)
        workers = _children(proc.pid)
        assert workers
        # Ctrl-C reaches the terminal's whole process group; `kill PID` only the main one
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        start = time.monotonic()
        _, err = proc.communicate(timeout=20)
        assert time.monotonic() - start < 8, "did not stop promptly"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + sig, err
    assert f"interrupted by {sig.name}" in err and "summary.csv" in err, err
    assert len(err.strip().splitlines()) == 1, err
    time.sleep(1.0)  # a terminated worker may take a moment to be reaped
    assert not [pid for pid in workers if _alive(pid)], "orphaned worker"

    summary = pd.read_csv(out / "summary.csv", dtype=str)
    done = sorted(p.parent.parent.name for p in out.glob("sub-*/ses-*/*_sidecar.json"))
    assert 2 <= len(summary) < N_SCANS
    assert set(summary.status) == {"done"}
    assert sorted("sub-" + summary.subject_id) == done
    # no half-written output: no temporary file, and every scan folder is complete or empty
    assert not list(out.rglob("*.tmp"))
    for folder in out.glob("sub-*/ses-*"):
        names = {p.name.split("_", 2)[-1] for p in folder.iterdir()}
        assert names in (set(), {"T1w_preproc.nii.gz", "qc.png", "sidecar.json"}), names
