"""What every ``adni-pu`` command promises its users (docs/interfaces.md, "Command line")."""

from __future__ import annotations

import shlex
from importlib.metadata import version
from pathlib import Path

import pandas as pd
import pytest
import typer.main
from test_cohort_build import cohort_inputs
from typer.testing import CliRunner

from adni_pu.cli.app import app

runner = CliRunner()


def _commands(cmd=None, path=()):
    """(path, click command) of every leaf command of the app."""
    cmd = cmd or typer.main.get_command(app)
    subs = getattr(cmd, "commands", None)
    if subs is None:
        yield path, cmd
        return
    for name, sub in subs.items():
        yield from _commands(sub, (*path, name))


def _help_records():
    for path, cmd in _commands():
        ctx = cmd.context_class(cmd, info_name=path[-1])
        for param in cmd.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and param.name != "help":
                yield path, param, record


def test_version_comes_from_package_metadata():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"adni-pu {version('adni-pu')}"


def test_every_value_option_shows_its_default():
    missing = [f"{' '.join(path)} {rec[0]}" for path, param, rec in _help_records()
               if param.param_type_name == "option" and not param.is_flag
               and "default:" not in rec[1]]
    assert missing == []


def test_flags_take_no_value_and_options_are_never_required():
    for path, param, rec in _help_records():
        if param.param_type_name != "option":
            continue
        assert not param.required, f"{' '.join(path)} {rec[0]}: required paths are positional"
        if param.is_flag:
            assert "<" not in rec[0], f"{' '.join(path)} {rec[0]}: a flag shown with a value"


@pytest.mark.parametrize("args", [["--help"], ["train", "--help"], ["preprocess", "--help"],
                                  ["cohort", "build", "--help"]])
def test_help_text_is_printed_as_written(args):
    result = runner.invoke(app, args)
    assert result.exit_code == 0
    assert "<bool>" not in result.output
    if args[0] == "train":  # bracketed names are not swallowed as markup
        assert "[train] and [data]" in " ".join(result.output.split())
        assert "Usage: adni-pu train [OPTIONS] [MANIFEST] [RUN]" in result.output
    if args[0] == "cohort":
        assert "[CLINICAL] [SCANS] [OUT]" in result.output
        assert "ADNIMERGE(_<date>).csv" in result.output


def test_train_takes_positional_paths_and_the_old_options_still_work(tmp_path):
    missing = tmp_path / "none.csv"
    new = runner.invoke(app, ["train", str(missing), str(tmp_path / "run")])
    old = runner.invoke(app, ["train", "--manifest", str(missing), "--out", str(tmp_path / "r")])
    for result in (new, old):
        assert result.exit_code == 2
        assert "none.csv not found" in result.output
    assert "--manifest is deprecated" in old.output and "deprecated" not in new.output
    both = runner.invoke(app, ["train", str(missing), str(tmp_path / "run"),
                               "--out", str(tmp_path / "other")])
    assert both.exit_code == 2 and "given twice" in both.output
    none = runner.invoke(app, ["train", str(missing)])
    assert none.exit_code == 2 and "RUN" in none.output and "missing" in none.output
    assert not (tmp_path / "run").exists()


def test_cohort_build_takes_positional_paths_and_the_old_options_still_work(tmp_path):
    missing = tmp_path / "nope.csv"
    args = [str(missing), str(tmp_path / "scans.csv"), str(tmp_path / "out")]
    new = runner.invoke(app, ["cohort", "build", *args])
    old = runner.invoke(app, ["cohort", "build", "--clinical", args[0], "--scans", args[1],
                              "--out", args[2]])
    for result in (new, old):
        assert result.exit_code == 2
        assert "nope.csv" in result.output
    assert "--clinical is deprecated" in old.output


def test_preprocess_prints_the_next_steps(tmp_path, monkeypatch):
    import adni_pu.preprocessing as prep

    def fake_run(inputs, output, cfg, **kwargs):
        return pd.DataFrame({"status": ["done", "skipped"], "subject_id": ["a", "b"],
                             "session_id": ["1", "1"], "error": ["", ""]})

    monkeypatch.setattr(prep, "run_preprocessing", fake_run)
    out = tmp_path / "prep"
    result = runner.invoke(app, ["preprocess", str(tmp_path), str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert f"next: adni-pu qc {out}" in result.output
    assert f"adni-pu cohort build ADNIMERGE.csv {Path(out) / 'summary.csv'}" in result.output


def test_preprocess_prints_redone_scans_and_kept_rows(tmp_path, monkeypatch):
    import adni_pu.preprocessing as prep

    def fake_run(inputs, output, cfg, **kwargs):
        return pd.DataFrame({
            "status": ["done", "done", "stale"], "subject_id": ["a", "b", "c"],
            "session_id": ["1", "1", "1"], "error": ["", "", ""],
            "note": ["redone: the input changed since its outputs were made", "",
                     "kept from an earlier run into this folder, made with other settings"]})

    monkeypatch.setattr(prep, "run_preprocessing", fake_run)
    result = runner.invoke(app, ["preprocess", str(tmp_path), str(tmp_path / "p"),
                                 "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "  done: sub-a ses-1: redone: the input changed" in result.output
    assert "1 row(s) kept from earlier runs into this folder (1 stale or missing" in result.output


def test_every_library_error_derives_from_one_base_and_keeps_its_builtin():
    import inspect

    from adni_pu import errors

    family = [c for _, c in inspect.getmembers(errors, inspect.isclass)
              if c.__module__ == errors.__name__ and c is not errors.AdniPuError
              and not issubclass(c, Warning)]  # AdniPuWarning: the warnings' own base
    assert len(family) >= 15
    for cls in family:
        assert issubclass(cls, errors.AdniPuError)
        assert issubclass(cls, (ValueError, RuntimeError)), cls  # old `except` clauses still work


def test_a_user_error_is_one_line_and_a_bug_shows_its_traceback(tmp_path, monkeypatch):
    from adni_pu import errors
    from adni_pu.workflows import evaluate as workflow

    def user_error(*args, **kwargs):
        raise errors.ManifestError("manifest m.csv: no rows in split 'test'")

    monkeypatch.setattr(workflow, "evaluate_run", user_error)
    result = runner.invoke(app, ["evaluate", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.strip() == "error: manifest m.csv: no rows in split 'test'"

    def bug(*args, **kwargs):
        raise ValueError("a programming error, not the user's")

    monkeypatch.setattr(workflow, "evaluate_run", bug)
    result = runner.invoke(app, ["evaluate", str(tmp_path)])
    assert result.exit_code == 1 and isinstance(result.exception, ValueError)
    assert "error:" not in result.output


# --------------------------------------------------------------------------- hints and warnings


def test_next_hints_quote_paths_for_the_shell(tmp_path):
    from adni_pu.cli.preprocess import next_steps

    out = tmp_path / "my prep's out"
    text = next_steps(out)
    assert f"adni-pu qc {shlex.quote(str(out))}" in text
    clinical, scans = cohort_inputs(tmp_path)
    folder = tmp_path / "cohort with space"
    result = runner.invoke(app, ["cohort", "build", str(clinical), str(scans), str(folder)])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("next:"))
    command = shlex.split(line.split(", then ", 1)[1])
    assert command[:2] == ["adni-pu", "train"] and Path(command[2]) == folder / "manifest.csv"


def test_a_manifest_warning_prints_as_one_line(tmp_path):
    path = tmp_path / "m.csv"
    pd.DataFrame({"subject_id": ["a", "b"], "scan_path": ["a.nii", "b.nii"],
                  "pu_label": [1, 0], "truth": [1, 0], "split": ["Train ", "val"]}
                 ).to_csv(path, index=False)
    result = runner.invoke(app, ["train", str(path), str(tmp_path / "run")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines[0] == (f"warning: manifest {path}: column split: read 'Train ' -> 'train' on "
                        "line 2 (split names are lower case, without spaces)")
    assert "ManifestWarning" not in result.output and ".py:" not in result.output
    assert lines[-1].startswith("error: ")
