"""``adni-pu synth``'s target folder and arguments: the umask's
mode, an existing folder kept as it is, ``synth .``, SIGTERM and SIGINT
leaving nothing, and bad arguments refused in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.synth.target import PARTIAL_PREFIX

FAST = ["--subjects", "2", "--voxel-size", "4", "--set", "visit_probabilities=[1,0,0]"]
ROOT = Path(__file__).resolve().parents[1]


def _synth(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from adni_pu.cli.app import main; main()",
                           "synth", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                          timeout=300)


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mode & 0o7777
            for p in [root, *root.rglob("*")]}


@pytest.mark.parametrize(("umask", "dir_mode", "file_mode"),
                         [(0o002, 0o775, 0o664), (0o077, 0o700, 0o600)])
def test_a_new_folder_gets_the_umasks_mode(tmp_path: Path, umask: int, dir_mode: int,
                                           file_mode: int) -> None:
    old = os.umask(umask)
    try:
        result = CliRunner().invoke(app, ["synth", str(tmp_path / "new" / "dl"), *FAST])
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    modes = _modes(tmp_path / "new" / "dl")
    assert modes.pop(".") == dir_mode
    for name, mode in modes.items():
        is_dir = (tmp_path / "new" / "dl" / name).is_dir()
        assert mode == (dir_mode if is_dir else file_mode), name
    assert not list(tmp_path.glob(f"**/{PARTIAL_PREFIX}*"))


def test_an_existing_empty_folder_keeps_its_mode_and_dot_works(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2775)
    result = _synth(shared, ".", *FAST)
    assert result.returncode == 0, result.stderr
    assert shared.stat().st_mode & 0o7777 == 0o2775
    assert sorted(p.name for p in shared.iterdir()) == [
        "ADNI", "ADNIMERGE.csv", "UCBERKELEY_AMY_6MM_28Jul2025.csv", "synth"]
    assert "next: cd . && adni-pu preprocess ADNI prep" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared"]  # nothing beside it


@pytest.mark.parametrize(("sig", "code", "line"), [
    (signal.SIGTERM, 143, "interrupted by SIGTERM"),
    (signal.SIGINT, 130, "interrupted by the user (Ctrl-C)")])
@pytest.mark.parametrize("existing", [False, True])
def test_a_signal_leaves_no_partial_folder(tmp_path: Path, sig: int, code: int, line: str,
                                           existing: bool) -> None:
    out = tmp_path / "dl"
    if existing:
        out.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from adni_pu.cli.app import main; main()", "synth", str(out),
         "--subjects", "2", "--voxel-size", "3"], cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    try:
        while not list(out.glob(f"{PARTIAL_PREFIX}*")) and proc.poll() is None:
            time.sleep(0.02)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    assert line in err and "Traceback" not in err
    assert [p.name for p in tmp_path.iterdir()] == (["dl"] if existing else [])
    if existing:
        assert list(out.iterdir()) == []


def test_a_killed_runs_partial_folder_is_named_on_the_rerun(tmp_path: Path) -> None:
    out = tmp_path / "dl"
    (out / f"{PARTIAL_PREFIX}abc123").mkdir(parents=True)
    result = CliRunner().invoke(app, ["synth", str(out), *FAST])
    assert result.exit_code == 2
    assert f"holds {PARTIAL_PREFIX}abc123, the unfinished download of a synth" in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--seed", "-1"], "error: --seed: expected a non-negative integer, found -1"),
    (["--set", "voxel_size=1", "--voxel-size", "3"],
     "error: --voxel-size 3 and --set voxel_size=1: two voxel sizes; give one of them"),
])
def test_bad_arguments_are_one_line_before_any_work(tmp_path: Path, args: list[str],
                                                    message: str) -> None:
    result = _synth(tmp_path, "out", *args)
    assert result.returncode == 2
    assert result.stderr.strip() == message
    assert list(tmp_path.iterdir()) == []


def test_the_same_voxel_size_twice_is_accepted(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["synth", str(tmp_path / "dl"), "--subjects", "1",
                                      "--set", "voxel_size=4", "--voxel-size", "4"])
    assert result.exit_code == 0, result.output
    assert "voxel_size = 4" in (tmp_path / "dl" / "synth" / "synth_config.toml").read_text()
