"""Writing outputs (adni_pu.fileio): files get the mode the umask gives, a full disk or a
read-only folder is one line naming the target (never the temporary name), nothing is left
half-written, and a folder that cannot be written is refused before any work."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest
from conftest import tiny_mnist_benchmark
from typer.testing import CliRunner

from adni_pu import fileio
from adni_pu.cli.app import app
from adni_pu.errors import OutputError
from adni_pu.fileio import check_out_dir
from adni_pu.locking import LOCK_NAME, output_lock

runner = CliRunner()


# --------------------------------------------------------------------------- file modes


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


# --------------------------------------------------------------------------- a full disk


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


def test_training_on_a_full_disk_is_one_line(tmp_path: Path, monkeypatch) -> None:
    import torch

    def full(*args, **kwargs):
        raise RuntimeError(TORCH_FULL)

    args = tiny_mnist_benchmark(tmp_path, monkeypatch)
    monkeypatch.setattr(torch, "save", full)
    result = runner.invoke(app, [*args, "--seeds", "1"])
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"error: {tmp_path / 'bm' / 'seed0' / 'checkpoints' / 'last.pt'}: "
                           "cannot write the file")


# --------------------------------------------------------------------------- a read-only folder


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


def test_a_read_only_output_folder_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch) -> None:
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(OutputError, match=r"new/run: cannot write there \(in .*\): "
                                          r"Permission denied"):
        check_out_dir(tmp_path / "new" / "run", "the run folder")
    assert not (tmp_path / "new").exists()


def test_the_cli_turns_a_refused_path_into_one_line(tmp_path: Path, monkeypatch) -> None:
    import adni_pu.workflows.evaluate as ev

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "report.md"))

    monkeypatch.setattr(ev, "evaluate_run", refused)
    result = runner.invoke(app, ["evaluate", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {tmp_path / 'report.md'}: Permission denied"
