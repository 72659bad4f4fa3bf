"""The benchmark protocol as named presets: ``adni-pu presets`` lists them, ``resolve_config``
applies them by name, and every built-in benchmark row resolves to the settings it had
before they were named (tests/data/benchmark_protocol_configs.json)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adni_pu import config as cfgmod
from adni_pu.cli.app import app
from adni_pu.pu.config import (
    PROTOCOL_DESCRIPTIONS,
    PROTOCOL_PRESETS,
    TRAINING_PRESETS,
    TrainConfig,
    protocol_settings,
)
from adni_pu.workflows.benchmark import BenchmarkSpec, protocol_presets, resolve_config

RECORD = Path(__file__).parent / "data" / "benchmark_protocol_configs.json"
METHODS = ("naive", "upu", "nnpu", "selfpu")


def _rows() -> dict[str, BenchmarkSpec]:
    """Every built-in row, named as in the record."""
    rows = {}
    for dataset in ("mnist", "cifar10"):
        for method in METHODS:
            cli = {"method": method, "threads": 0, "device": "auto"}  # as `adni-pu` builds it
            rows[f"{dataset} --method {method} (cli)"] = BenchmarkSpec(dataset, method,
                                                                      settings=cli)
            rows[f"{dataset} --method {method} (library)"] = BenchmarkSpec(dataset, method)
        for preset in TRAINING_PRESETS:
            rows[f"{dataset} --preset {preset}"] = BenchmarkSpec(
                dataset, "nnpu", preset, settings={"threads": 0, "device": "auto"})
    return rows


def test_every_builtin_row_resolves_to_its_recorded_settings():
    recorded = json.loads(RECORD.read_text())["configs"]
    rows = _rows()
    assert sorted(rows) == sorted(recorded)  # a new preset: record it (see the file's note)
    defaults = cfgmod.to_dict(TrainConfig())
    for name, spec in rows.items():
        expected = copy.deepcopy(defaults)
        cfgmod.deep_update(expected, recorded[name])
        assert cfgmod.to_dict(resolve_config(spec, 3)) == expected, name


@pytest.mark.parametrize("dataset, method, names", [
    ("mnist", "nnpu", ["mnist-protocol"]),
    ("cifar10", "selfpu", ["cifar10-protocol", "selfpu-final-model"]),
    ("mnist", None, ["mnist-protocol"])])
def test_a_row_names_its_protocol_presets(dataset, method, names):
    assert protocol_presets(dataset, method) == names
    for name in names:
        cfgmod.from_dict(TrainConfig, protocol_settings(name))  # each is a valid setting set


def test_the_protocol_is_applied_by_name_and_the_user_still_wins(monkeypatch):
    from adni_pu.pu import config as pu_config

    changed = {**PROTOCOL_PRESETS, "mnist-protocol": {"track_test": False, "lr": 0.25}}
    monkeypatch.setattr(pu_config, "PROTOCOL_PRESETS", changed)
    cfg = resolve_config(BenchmarkSpec("mnist", "sps"), 0)  # the table, not a copy of it
    assert (cfg.track_test, cfg.lr, cfg.selection) == (False, 0.25, "final")
    spec = BenchmarkSpec("mnist", "sps", overrides=["lr=0.5", 'selection="best_epoch"'])
    cfg = resolve_config(spec, 0)
    assert (cfg.lr, cfg.selection) == (0.5, "best_epoch")


def test_presets_lists_the_protocol_with_its_settings():
    result = CliRunner().invoke(app, ["presets"])
    assert result.exit_code == 0, result.output
    assert set(PROTOCOL_DESCRIPTIONS) == set(PROTOCOL_PRESETS)
    lines = result.output.splitlines()
    assert any(line.startswith("benchmark protocol") for line in lines)
    for line in ('mnist-protocol       every MNIST benchmark row: track_test=true, '
                 'weight_decay=0.0',
                 'selfpu-final-model   benchmark rows whose training preset is Self-PU '
                 '(method = selfpu): selection="final"'):
        assert line in lines
    assert "cifar10-protocol" in result.output and "lr=0.0005" in result.output
