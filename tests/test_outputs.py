"""Every command owns its outputs (workflows.run_folder, adni_pu.outputs, adni_pu.locking): the
run folder's one layout, the registry of the names each command writes, ``--out`` that
never replaces a file the command did not write, and the folder lock of every writing command."""

from __future__ import annotations

import fcntl
import fnmatch
import json
import os
import socket
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner
from volume_helpers import NO_AUGMENTATION, make_volume_cohort, tiny_overrides

from adni_pu.cli.app import app
from adni_pu.errors import OutputError, OutputLockedError
from adni_pu.locking import LOCK_NAME, output_lock
from adni_pu.workflows.evaluate import evaluate_run
from adni_pu.workflows.interpret import interpret_run
from adni_pu.workflows.output_registry import registry
from adni_pu.workflows.run_folder import RUN_LAYOUT, finished_work
from adni_pu.workflows.train import train_volumes
from adni_pu.workflows.volume_settings import load_volume_config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny cohort and a 1-epoch naive run folder, evaluated on its test split."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("outputs")
    manifest = make_volume_cohort(root / "cohort")
    cfg = load_volume_config(None, tiny_overrides(1) + NO_AUGMENTATION, preset="naive")
    train_volumes(manifest, cfg, root / "run", log=lambda m: None)
    evaluate_run(root / "run", "test", n_boot=20)
    return {"root": root, "manifest": manifest, "run": root / "run"}


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _interpret(run_dir: Path, **kw):
    return interpret_run(run_dir, kw.pop("split", "test"), "gradcam", device="cpu",
                         sanity_subjects=0, n_boot=10, **kw)


# --------------------------------------------------------------------------- the registry


def test_every_name_train_writes_is_declared_in_the_run_folder_layout(run):
    declared = [o.name.rstrip("/") for o in RUN_LAYOUT.names]
    for entry in run["run"].iterdir():
        assert any(fnmatch.fnmatch(entry.name, name) for name in declared), entry.name
    names = {(c, f, n) for c, f, n in registry()}
    assert ("train", "RUN", "scans.csv") in names and ("interpret", "OUT", "scans.csv") in names
    assert ("evaluate", "RUN", "evaluation/") in names


def test_a_prior_classifier_checkpoint_is_finished_work(tmp_path):
    """Finding 12: Ctrl-C during train with prior = 'estimate' removed the classifier."""
    (tmp_path / "prior_estimate" / "checkpoints").mkdir(parents=True)
    (tmp_path / "prior_estimate" / "checkpoints" / "last.pt").write_bytes(b"x")
    assert "prior_estimate" in finished_work(tmp_path)


# --------------------------------------------------------------------------- interpret


def test_interpret_out_run_is_refused_and_keeps_the_runs_scans_record(run):
    """Finding 8: interpret --out RUN replaced RUN/scans.csv, the leakage guard's record."""
    before = (run["run"] / "scans.csv").read_bytes()
    result = CliRunner().invoke(app, ["interpret", str(run["run"]), "--out", str(run["run"]),
                                      "--sanity", "0", "--device", "cpu"])
    assert result.exit_code == 2, result.output
    assert "holds the outputs of `adni-pu train`" in result.output
    assert (run["run"] / "scans.csv").read_bytes() == before
    evaluation = run["run"] / "evaluation" / "test"
    with pytest.raises(OutputError, match="adni-pu evaluate"):
        _interpret(run["run"], out=evaluation)


def test_interpret_into_a_locked_folder_is_refused(run, tmp_path):
    """Finding 6: two interprets into one --out deleted each other's maps."""
    out = tmp_path / "maps"
    out.mkdir()
    fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(OutputLockedError, match="in use by"):
            _interpret(run["run"], out=out)
    finally:
        os.close(fd)
    assert [p.name for p in out.iterdir()] == [LOCK_NAME]


def test_interrupted_interpret_leaves_the_folder_as_it_was(run, tmp_path, monkeypatch):
    """Finding 18: Ctrl-C during interpret left maps of two runs."""
    import adni_pu.interpret.maps as maps

    out = tmp_path / "maps"
    _interpret(run["run"], out=out)
    before = _snapshot(out)
    assert any(name.startswith("maps/") for name in before)
    real, calls = maps.attribution_map, []

    def stop_on_second(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kw) * 2.0  # a new map differs from the kept one

    monkeypatch.setattr(maps, "attribution_map", stop_on_second)
    with pytest.raises(KeyboardInterrupt):
        _interpret(run["run"], out=out)
    assert _snapshot(out) == before  # no new map, no hidden partial folder, no lock file


def test_interpret_arguments_are_refused_by_their_names(run):
    """Finding 25: --sanity -2 and --threads -3 were accepted; --patch 0 named internals."""
    for args, name in ((["--sanity", "-2"], "--sanity"), (["--threads", "-3"], "--threads"),
                       (["--patch", "0"], "--patch"), (["--samples", "0"], "--samples")):
        result = CliRunner().invoke(app, ["interpret", str(run["run"]), *args])
        assert result.exit_code == 2 and name in result.output, (args, result.output)
        assert "occlusion_batch" not in result.output


# --------------------------------------------------------------------------- evaluate


def test_evaluate_on_another_manifest_keeps_the_runs_own_evaluation(run):
    """Finding 10: evaluate --manifest OTHER overwrote RUN/evaluation/test."""
    own = run["run"] / "evaluation" / "test"
    before = _snapshot(own)
    other = run["root"] / "cohort" / "external.csv"
    pd.read_csv(run["manifest"]).assign(site="external").to_csv(other, index=False)
    result = evaluate_run(run["run"], "test", other, n_boot=10)
    written = Path(result["files"]["metrics"]).parent
    assert written.parent.parent == run["run"] / "evaluation"
    assert written.name == "test" and written.parent.name.startswith("external-")
    assert json.loads((written / "metrics.json").read_text())["manifest"] == str(other)
    assert _snapshot(own) == before
    with pytest.raises(OutputError, match="adni-pu train"):  # --out RUN: the run's files
        evaluate_run(run["run"], "test", other, n_boot=10, out=run["run"])


def test_evaluate_into_a_locked_folder_is_refused(run):
    out = run["run"] / "evaluation" / "test"
    fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(OutputLockedError):
            evaluate_run(run["run"], "test", n_boot=10)
    finally:
        os.close(fd)
        (out / LOCK_NAME).unlink()


# --------------------------------------------------------------------------- predict


@pytest.mark.parametrize("text", ["\n# My analysis notes\nkeep me\n", "\r\nimportant,data\n"])
def test_predict_out_keeps_a_file_whose_first_line_is_blank(run, tmp_path, text):
    """Finding 9: a blank first line was read as an empty file and replaced."""
    notes = tmp_path / "notes.md"
    notes.write_bytes(text.encode())
    scan = run["manifest"].parent / pd.read_csv(run["manifest"])["scan_path"].iloc[0]
    result = CliRunner().invoke(app, ["predict", str(run["run"]), str(scan), "--out",
                                      str(notes), "--device", "cpu"])
    assert result.exit_code == 2 and "not a predictions table" in result.output
    assert notes.read_bytes() == text.encode()
    again = tmp_path / "preds.csv"  # its own table (and an empty file) it replaces
    again.write_bytes(b"")
    for _ in range(2):
        result = CliRunner().invoke(app, ["predict", str(run["run"]), str(scan), "--out",
                                          str(again), "--device", "cpu"])
        assert result.exit_code == 0, result.output
    assert not (tmp_path / LOCK_NAME).exists()


# --------------------------------------------------------------------------- benchmark table


def _results(folder: Path, method: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    per_seed = [{"seed": s, "test": {"accuracy": 0.5 + s / 100, "auc": 0.6},
                 "test_accuracy_test_selected": 0.6, "seconds_per_epoch": {"phase1": 1.0},
                 "nn_correction_share": None} for s in range(2)]
    (folder / f"{method}.json").write_text(json.dumps(
        {"settings": {"method": method, "epochs": 3}, "results": {method: {}},
         "per_seed": per_seed}))


def _table(*args: str):
    return CliRunner().invoke(app, ["benchmark", "table", *map(str, args)])


def test_benchmark_table_out_never_replaces_a_file_it_did_not_write(tmp_path):
    """Finding 15: --out NOTES replaced NOTES.md; --out FOLDER/tbl broke the next table;
    --out tab.md wrote tab.md.md."""
    _results(tmp_path / "real", "naive")
    _results(tmp_path / "real", "nnpu")
    notes = tmp_path / "NOTES.md"
    notes.write_text("# my notes\n")
    result = _table(tmp_path / "real", "--out", tmp_path / "NOTES")
    assert result.exit_code == 2 and "NOTES.md" in result.output
    assert notes.read_text() == "# my notes\n"
    inside = _table(tmp_path / "real", "--out", tmp_path / "real" / "tbl")
    assert inside.exit_code == 2 and "inside the results folder" in inside.output
    assert _table(tmp_path / "real").exit_code == 0  # the next table still reads FOLDER
    for _ in range(2):  # its own files it replaces
        result = _table(tmp_path / "real", "--out", tmp_path / "tab.md")
        assert result.exit_code == 0, result.output
    assert (tmp_path / "tab.md").is_file() and (tmp_path / "tab.json").is_file()
    assert not (tmp_path / "tab.md.md").exists() and not (tmp_path / LOCK_NAME).exists()


def test_benchmark_table_names_a_missing_folder_and_a_file(tmp_path):
    """Finding 24: both said "no *.json results files"."""
    missing = _table(tmp_path / "nowhere")
    assert missing.exit_code == 2 and "folder not found" in missing.output
    (tmp_path / "afile").write_text("x")
    afile = _table(tmp_path / "afile")
    assert afile.exit_code == 2 and "is a file, not a folder" in afile.output


# --------------------------------------------------------------------------- the lock


def test_a_lock_that_is_a_symlink_is_refused_and_its_target_kept(tmp_path):
    """Finding 16: the lock record was written over the symlink's target."""
    precious = tmp_path / "precious.txt"
    precious.write_text("two\nlines\n")
    folder = tmp_path / "sym"
    folder.mkdir()
    (folder / LOCK_NAME).symlink_to(precious)
    with pytest.raises(OutputError, match="symbolic link"), output_lock(folder, "cohort build"):
        pass
    assert precious.read_text() == "two\nlines\n"


def test_a_dead_processs_record_is_never_named_as_the_holder(tmp_path):
    """Finding 20: a read-only lock file's old record was named as the live holder's."""
    dead = {"pid": 4_194_999, "host": socket.gethostname(), "command": "cohort build",
            "argv": "adni-pu cohort build OLD-TABLE.csv", "since": "2026-12-06T09:00:00"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(dead) + "\n")
    fd = os.open(tmp_path / LOCK_NAME, os.O_RDONLY)  # a holder that cannot rewrite it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(OutputLockedError) as refused, output_lock(tmp_path, "cohort build"):
            pass
    finally:
        os.close(fd)
    assert "4194999" not in str(refused.value) and "OLD-TABLE" not in str(refused.value)
    assert "another process" in str(refused.value)
