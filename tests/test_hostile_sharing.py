"""Issue 37, sharing: one process per output folder, outputs colleagues can read, one-line
errors for a full disk, a read-only folder or a missing GPU, and what Ctrl-C keeps.

Findings 4, 8 (the lock of :mod:`adni_pu.locking`), 9 (the umask's mode), 13 (``--device``),
15 (a full disk), 25 (the temporary name in an error) and 26 (Ctrl-C).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adni_pu import fileio
from adni_pu.cli.app import app
from adni_pu.errors import DeviceError, OutputError, OutputLockedError
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


# --------------------------------------------------------------------------- 4: the lock


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


# --------------------------------------------------------------------------- 8: preprocess

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


# --------------------------------------------------------------------------- 9: file modes


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_outputs_get_the_mode_the_umask_gives(tmp_path: Path, umask: int, mode: int) -> None:
    import torch

    old = os.umask(umask)
    try:
        assert fileio.current_umask() == umask
        text = fileio.atomic_write_text(tmp_path / "summary.csv", "a\n")
        saved = fileio.atomic_torch_save({"w": torch.zeros(2)}, tmp_path / "best_model.pt")
        volume = tmp_path / "v.nii.gz"
        os.replace(fileio.write_temporary(volume, b"data"), volume)
        with output_lock(tmp_path / "run", "train"):
            lock = (tmp_path / "run" / LOCK_NAME).stat().st_mode & 0o777
    finally:
        os.umask(old)
    for path in (text, saved, volume):
        assert path.stat().st_mode & 0o777 == mode, path
    assert lock == mode


# --------------------------------------------------------------------------- 13: --device


@pytest.fixture
def no_cuda(monkeypatch):
    """This machine as one without CUDA, whatever it has."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)


@pytest.mark.parametrize("args", [
    ["evaluate", "RUN", "--device", "cuda"],
    ["predict", "RUN", "scan.nii", "--device", "cuda"],
    ["benchmark", "mnist", "--out", "OUT", "--device", "cuda"],
    ["train", "m.csv", "RUN", "--set", 'train.device="cuda"'],
])
def test_cuda_on_a_machine_without_it_is_one_line(tmp_path: Path, no_cuda, args) -> None:
    args = [str(tmp_path / a) if a in ("RUN", "OUT") else a for a in args]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    line = result.output.strip()
    assert "\n" not in line and line.startswith("error: ")
    assert "cuda: CUDA is not available on this machine (torch " in line
    assert "built without CUDA" in line and "cpu" in line
    assert not (tmp_path / "RUN").exists() and not (tmp_path / "OUT").exists()


@pytest.mark.parametrize("args", [["evaluate", "RUN", "--device", "tpu"],
                                  ["benchmark", "mnist", "--out", "OUT", "--device", "tpu"]])
def test_an_unknown_device_is_one_line(tmp_path: Path, args) -> None:
    result = runner.invoke(app, [str(tmp_path / a) if a in ("RUN", "OUT") else a for a in args])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == ("error: --device 'tpu': expected auto, cpu, cuda, cuda:N "
                                     "(N: the GPU's number) or mps")


def test_device_resolution(no_cuda) -> None:
    from adni_pu.pu.device_data import resolve_device

    assert resolve_device("auto").type == "cpu" and resolve_device("CPU").type == "cpu"
    for bad in ("cuda:", "cuda:x", "gpu", ""):
        with pytest.raises(DeviceError, match="expected auto, cpu, cuda"):
            resolve_device(bad)
    with pytest.raises(DeviceError, match='use train.device="cpu" or auto'):
        resolve_device("cuda:0", "train.device")


# --------------------------------------------------------------------------- 15: full disk


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")  # as write() raises it: no name


def test_a_write_on_a_full_disk_names_the_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(Path, "write_text", _no_space)
    with pytest.raises(OSError) as failed:
        fileio.atomic_write_text(tmp_path / "preprocess_config.toml", "x = 1\n")
    assert failed.value.errno == errno.ENOSPC
    assert failed.value.filename == str(tmp_path / "preprocess_config.toml")
    assert list(tmp_path.iterdir()) == []  # no temporary file left
    monkeypatch.setattr(Path, "open", _no_space)
    with pytest.raises(OSError) as failed:
        fileio.write_temporary(tmp_path / "v.nii.gz", b"data")
    assert failed.value.filename == str(tmp_path / "v.nii.gz")
    assert list(tmp_path.iterdir()) == []


def test_preprocess_on_a_full_disk_is_one_line(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "s1.nii.gz").write_bytes(b"scan")
    monkeypatch.setattr(Path, "write_text", _no_space)
    out = tmp_path / "out"
    result = runner.invoke(app, ["preprocess", str(tmp_path / "s1.nii.gz"), str(out),
                                 "--no-progress"])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (f"error: {out / 'preprocess_config.toml'}: No space "
                                     "left on device")


def test_a_full_disk_without_a_file_name_is_still_one_line(monkeypatch) -> None:
    from adni_pu.pu import config as pu_config

    class Failing(dict):
        def items(self):
            _no_space()

    monkeypatch.setattr(pu_config, "PRESET_DESCRIPTIONS", Failing())
    result = runner.invoke(app, ["presets"])
    assert result.exit_code == 2
    assert result.output.strip().startswith("error: a write failed: No space left on device "
                                            "(errno ENOSPC)")


TORCH_FULL = "[enforce fail at inline_container.cc:672] . unexpected pos 36864 vs 36760"


def test_torch_save_on_a_full_disk_names_the_file(tmp_path: Path, monkeypatch) -> None:
    import torch

    def full(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"half")
        raise RuntimeError(TORCH_FULL)

    monkeypatch.setattr(torch, "save", full)
    target = tmp_path / "checkpoints" / "last.pt"
    with pytest.raises(OutputError) as failed:
        fileio.atomic_torch_save({"w": 1}, target)
    message = str(failed.value)
    assert message.startswith(f"{target}: cannot write the file ({TORCH_FULL})")
    assert "free on its file system" in message
    assert list(target.parent.iterdir()) == []


def _tiny_mnist(tmp_path: Path, monkeypatch) -> list[str]:
    from test_readers import write_mnist

    from adni_pu.data import readers

    monkeypatch.setitem(readers.MNIST_COUNTS, "train", 200)
    monkeypatch.setitem(readers.MNIST_COUNTS, "test", 40)
    write_mnist(tmp_path / "mnist", n_train=200, n_test=40)
    return ["benchmark", "mnist", "--epochs", "1", "--n-labelled", "60", "--threads", "1",
            "--data-dir", str(tmp_path / "mnist"), "--out", str(tmp_path / "bm"),
            "--set", "progress=false"]


def test_training_on_a_full_disk_is_one_line(tmp_path: Path, monkeypatch) -> None:
    import torch

    def full(*args, **kwargs):
        raise RuntimeError(TORCH_FULL)

    args = _tiny_mnist(tmp_path, monkeypatch)
    monkeypatch.setattr(torch, "save", full)
    result = runner.invoke(app, [*args, "--seeds", "1"])
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"error: {tmp_path / 'bm' / 'seed0' / 'checkpoints' / 'last.pt'}: "
                           "cannot write the file")


# --------------------------------------------------------------------------- 25: read-only


def test_a_read_only_folder_names_the_target_not_the_temporary_file(
        tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "evaluation" / "test" / "report.md"
    target.parent.mkdir(parents=True)
    hidden = target.parent / ".report.md.k2j4_x.tmp"

    def refused(*args, **kwargs):  # what mkstemp raises in a read-only folder
        raise PermissionError(errno.EACCES, "Permission denied", str(hidden))

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    with pytest.raises(PermissionError) as failed:
        fileio.atomic_write_text(target, "# report\n")
    assert failed.value.filename == str(target) and ".tmp" not in str(failed.value)
    monkeypatch.undo()

    def refused_tmp(tmp: Path) -> None:  # a writer refused on the temporary file itself
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp))

    with pytest.raises(PermissionError) as failed:
        fileio.atomic_write(target, refused_tmp)
    assert failed.value.filename == str(target)
    assert list(target.parent.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_really_read_only_folder_names_the_target(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(PermissionError) as failed:
            fileio.atomic_write_text(folder / "report.md", "x")
        assert failed.value.filename == str(folder / "report.md")
    finally:
        folder.chmod(0o755)


# --------------------------------------------------------------------------- 26: Ctrl-C


def test_ctrl_c_in_a_benchmark_says_what_is_kept_and_the_rerun_continues(
        tmp_path: Path, monkeypatch) -> None:
    from adni_pu.workflows import benchmark

    args = [*_tiny_mnist(tmp_path, monkeypatch), "--seeds", "2"]
    finish = benchmark.seed_result

    def stopped_in_seed_1(spec, seed, *rest, **kw):  # Ctrl-C once seed 1 has trained
        if seed == 1:
            raise KeyboardInterrupt
        return finish(spec, seed, *rest, **kw)

    monkeypatch.setattr(benchmark, "seed_result", stopped_in_seed_1)
    result = runner.invoke(app, args)
    assert result.exit_code == 130
    bm = tmp_path / "bm"
    line = result.output.strip().splitlines()[-1]
    assert line == ("interrupted by the user (Ctrl-C); kept seed 0: "
                    f"{bm / 'seed0' / 'result.json'}; seed 1: the checkpoint of its last finished epoch "
                    f"({bm / 'seed1' / 'checkpoints' / 'last.pt'}); run the same command "
                    "again to continue from there")
    monkeypatch.setattr(benchmark, "seed_result", finish)
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "seed 0: already done" in again.output
    assert (bm / "results.json").is_file()


def test_ctrl_c_in_any_command_is_one_line_and_exit_130(monkeypatch) -> None:
    from adni_pu.workflows import evaluate

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "evaluate_run", interrupted)
    result = runner.invoke(app, ["evaluate", "RUN"])
    assert result.exit_code == 130
    assert result.output.strip() == ("interrupted by the user (Ctrl-C); every file is written "
                                     "whole or not at all, so nothing is left half-written; "
                                     "run the command again")
