"""A reduced ``adni-pu demo`` (ideal volumes, 12 subjects, 1 epoch): the integration test.

Marked slow (about 30 CPU-seconds, mostly generating the cohort); CI runs it with
``pytest -m slow tests/test_demo.py``.
"""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from adni_pu.cli.volumes import register


@pytest.mark.slow
def test_reduced_demo_runs_end_to_end(tmp_path):
    app = typer.Typer(pretty_exceptions_enable=False)
    register(app, with_demo=True)
    out = tmp_path / "demo"
    result = CliRunner().invoke(app, [
        "demo", "--subjects", "12", "--out", str(out), "--preprocessing", "ideal",
        "--epochs", "2", "--methods", "nnpu,selfpu", "--threads", "1", "--workers", "1"])
    assert result.exit_code == 0, result.output
    report = (out / "report.md").read_text()
    assert "| nnpu |" in report and "| selfpu |" in report
    assert (out / "roc.png").is_file()
    summary = json.loads((out / "demo.json").read_text())
    assert set(summary["results"]) == {"nnpu", "selfpu"}
    for method in ("nnpu", "selfpu"):
        assert (out / "runs" / method / "evaluation" / "test" / "metrics.json").is_file()
