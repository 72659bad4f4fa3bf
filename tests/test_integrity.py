"""Nothing half-read, nothing half-written: truncated volumes, read-only outputs, one-line
errors (issue 25)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.errors import OutputError
from adni_pu.fileio import check_out_dir

runner = CliRunner()


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


def test_benchmark_with_no_seeds_is_a_one_line_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["benchmark", "mnist", "--seeds", "0", "--data-dir",
                                 str(tmp_path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        "error: --seeds: expected at least 1 seed, found 0"]


def test_a_bad_set_value_is_blamed_on_the_set_not_on_the_settings_file(tmp_path: Path) -> None:
    from adni_pu.errors import ConfigError
    from adni_pu.workflows.volume_settings import load_volume_config

    cfg = tmp_path / "c.toml"
    cfg.write_text("[train]\nepochs = 2\n")
    with pytest.raises(ConfigError, match=r"^--set train.batch_size=abc: expected an integer, "
                                          r"found 'abc'$"):
        load_volume_config(cfg, ["train.batch_size=abc"])
    with pytest.raises(ConfigError, match=r"^--set train.batchsize=3: unknown setting"):
        load_volume_config(cfg, ["train.batchsize=3"])
    cfg.write_text("[train]\nepochs = \"many\"\n")  # the file's own mistake names the file
    with pytest.raises(ConfigError, match=r"c.toml.train.epochs: expected an integer"):
        load_volume_config(cfg, ["train.batch_size=4"])
