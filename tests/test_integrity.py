"""Nothing half-read, nothing half-written: truncated volumes, read-only outputs, one-line
errors (issue 25)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from adni_pu.cli.app import app

runner = CliRunner()


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
