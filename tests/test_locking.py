"""One process per output folder (adni_pu.locking.output_lock): a second process is
refused at once naming the holder, a killed holder's lock is taken, forked workers
and shards, every command that writes a folder holds its lock, and a refused
preprocess leaves the folder's summary.csv as it was."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.errors import OutputLockedError
from adni_pu.locking import LOCK_NAME, output_lock

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _python(code: str, cwd: Path) -> subprocess.Popen:
    """A Python process running ``code`` in ``cwd`` (this checkout's adni_pu)."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until ``path`` exists (the other process got where it signals); fail if it died."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the other process ended early: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.02)


HOLDER = """
    import os, sys, time
    from pathlib import Path
    from adni_pu.locking import output_lock
    with output_lock({folder!r}, {command!r}, {part!r}):
        if {fork!r}:
            child = os.fork()
            if child == 0:  # a worker that outlives its parent
                time.sleep(60)
                os._exit(0)
            Path("child.pid").write_text(str(child))
        Path("locked").touch()
        while not Path("release").exists():
            time.sleep(0.02)
"""


def _holder(tmp_path: Path, folder: Path, command: str = "train", part: str | None = None,
            fork: bool = False) -> subprocess.Popen:
    """A process holding the lock of ``folder`` until ``tmp_path/release`` exists."""
    proc = _python(HOLDER.format(folder=str(folder), command=command, part=part, fork=fork),
                   tmp_path)
    _wait_for(tmp_path / "locked", proc)
    return proc


def _release(tmp_path: Path, proc: subprocess.Popen) -> None:
    (tmp_path / "release").touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


# --------------------------------------------------------------------------- the lock


def test_a_second_process_is_refused_at_once_naming_the_holder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    holder = _holder(tmp_path, run, "train")
    try:
        with pytest.raises(OutputLockedError) as refused, output_lock(run, "train"):
            pass
        message = str(refused.value)
        assert f"pid {holder.pid} on " in message and "since " in message
        assert str(run) in message and "\n" not in message
        # the command line: one line, exit 2, and the refused train wrote nothing
        result = runner.invoke(app, ["train", str(tmp_path / "m.csv"), str(run)])
        assert result.exit_code == 2, result.output
        assert result.output.startswith("error: ") and f"pid {holder.pid}" in result.output
        assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]
    finally:
        _release(tmp_path, holder)
    assert not run.exists()  # the holder created the folder and wrote nothing into it
    with output_lock(run, "train"):  # free again
        pass


def test_a_killed_holder_leaves_a_lock_the_next_run_takes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    holder = _holder(tmp_path, run, "train")
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    stale = json.loads((run / LOCK_NAME).read_text())
    assert stale["pid"] == holder.pid  # the file stays behind: only its flock died
    with output_lock(run, "train"):
        assert json.loads((run / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert not (run / LOCK_NAME).exists()


def test_a_forked_worker_does_not_keep_its_parents_lock(tmp_path: Path) -> None:
    run = tmp_path / "run"
    holder = _holder(tmp_path, run, "preprocess", fork=True)
    child = int((tmp_path / "child.pid").read_text())
    try:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
        os.kill(child, 0)  # the forked child is still alive ...
        with output_lock(run, "preprocess"):  # ... and holds nothing
            pass
    finally:
        os.kill(child, signal.SIGKILL)


def test_shards_share_a_folder_but_not_a_shard(tmp_path: Path) -> None:
    out = tmp_path / "out"
    holder = _holder(tmp_path, out, "preprocess", part="shard-1-of-2")
    try:
        with output_lock(out, "preprocess", "shard-2-of-2"):
            pass
        with pytest.raises(OutputLockedError, match=f"pid {holder.pid}"), \
                output_lock(out, "preprocess", "shard-1-of-2"):
            pass
        with pytest.raises(OutputLockedError, match=f"pid {holder.pid}"), \
                output_lock(out, "preprocess"):
            pass
    finally:
        _release(tmp_path, holder)


def test_every_command_that_writes_a_folder_holds_its_lock(tmp_path: Path) -> None:
    from adni_pu.cohort import write_cohort
    from adni_pu.preprocessing import run_preprocessing
    from adni_pu.workflows.benchmark import BenchmarkSpec, run_benchmark
    from adni_pu.workflows.demo import DemoSettings, run_demo
    from adni_pu.workflows.train import train_volumes

    out = tmp_path / "out"
    holder = _holder(tmp_path, out, "train")
    calls = {  # refused before their bodies run, so their other arguments are not read
        "preprocess": lambda: run_preprocessing(tmp_path / "in", out),
        "cohort build": lambda: write_cohort(None, out),  # type: ignore[arg-type]
        "train": lambda: train_volumes(tmp_path / "m.csv", None, out),  # type: ignore[arg-type]
        "benchmark": lambda: run_benchmark(BenchmarkSpec("mnist", out=out)),
        "demo": lambda: run_demo(DemoSettings(out=out)),
    }
    try:
        for command, call in calls.items():
            with pytest.raises(OutputLockedError, match=f"pid {holder.pid} .*adni-pu "
                                                         f"{command} cannot write there"):
                call()
    finally:
        _release(tmp_path, holder)


def test_a_folder_this_user_cannot_write_runs_unlocked(tmp_path: Path, monkeypatch) -> None:
    real = os.open

    def refused(path, *args, **kwargs):
        if str(path).endswith(LOCK_NAME):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refused)
    (tmp_path / "ro").mkdir()
    with output_lock(tmp_path / "ro", "train"):  # the command's own write names the folder
        assert not (tmp_path / "ro" / LOCK_NAME).exists()


def test_a_nested_lock_in_one_thread_is_reentrant(tmp_path: Path) -> None:
    with output_lock(tmp_path / "o", "demo"), output_lock(tmp_path / "o", "cohort build"):
        assert (tmp_path / "o" / LOCK_NAME).is_file()
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- preprocess

FAKE_STEPS = """
    import sys, time
    from pathlib import Path
    import adni_pu.preprocessing.pipeline as pipe

    def fake(scan, paths, config, timings):
        Path({started!r}).touch()
        while not Path({release!r}).exists():
            time.sleep(0.02)
        timings["read"] = 0.0
        files = {{paths["preproc"]: b"volume", paths["brainmask_native"]: b"mask",
                 paths["qc"]: b"png"}}
        return files, "done", [], {{"qc": {{"brain_volume_ml": 1200.0}}}}

    pipe._run_steps = fake
    from adni_pu.cli.app import main
    sys.argv = ["adni-pu", "preprocess", {scan!r}, "out", "--no-progress",
                "--set", "runner.workers=1"]
    main()
"""


def test_a_refused_preprocess_leaves_summary_csv_alone_and_a_later_run_adds_its_scan(
        tmp_path: Path, monkeypatch) -> None:
    import pandas as pd

    from adni_pu.preprocessing import pipeline as pipe

    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.nii.gz").write_bytes(name.encode())
    (tmp_path / "go").touch()
    monkeypatch.setattr(pipe, "_run_steps", _fake_steps(tmp_path))
    monkeypatch.chdir(tmp_path)
    args = ["--no-progress", "--set", "runner.workers=1"]
    assert runner.invoke(app, ["preprocess", "a.nii.gz", "out", *args]).exit_code == 0
    (tmp_path / "go").unlink()
    summary = tmp_path / "out" / "summary.csv"
    before = (summary.read_bytes(), summary.stat().st_mtime_ns)
    # another process preprocesses b into the same folder, held inside its scan
    running = _python(FAKE_STEPS.format(scan="b.nii.gz", started="started-b", release="go"),
                      tmp_path)
    _wait_for(tmp_path / "started-b", running)
    second = runner.invoke(app, ["preprocess", "c.nii.gz", "out", *args])
    assert second.exit_code == 2
    assert second.output.startswith("error: ") and f"pid {running.pid}" in second.output
    assert len(second.output.strip().splitlines()) == 1
    assert (summary.read_bytes(), summary.stat().st_mtime_ns) == before
    assert not (tmp_path / "started-c.nii.gz").exists()
    (tmp_path / "go").touch()
    assert running.wait(timeout=120) == 0, running.communicate()
    assert runner.invoke(app, ["preprocess", "c.nii.gz", "out", *args]).exit_code == 0
    rows = pd.read_csv(summary, dtype=str)
    assert sorted(rows.subject_id) == ["a", "b", "c"]
    assert set(rows.status) == {"done"}


def _fake_steps(folder: Path):
    """The pipeline's steps, instant (the test process's own runs)."""
    def fake(scan, paths, config, timings):
        (folder / f"started-{scan.path.name}").touch()
        timings["read"] = 0.0
        files = {paths["preproc"]: b"volume", paths["brainmask_native"]: b"mask",
                 paths["qc"]: b"png"}
        return files, "done", [], {"qc": {"brain_volume_ml": 1200.0}}
    return fake
