"""Issue 37, the training findings: leakage by content and canonical id (3), contradictory
manifests (5), setting ranges (14, 27) and the ``--set`` that gave a bad value (20), a
failed train that no longer blocks its rerun (19), quoted "next:" hints (24), warnings as
one line (28), PTIDs that are paths (29) and a demo cohort too small for its folds (30b).

Each test reproduces its finding on tiny synthetic inputs and checks the fixed behaviour.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner
from volume_helpers import make_volume_cohort, tiny_overrides

from adni_pu.cli.app import app
from adni_pu.cohort import read_manifest
from adni_pu.cohort.ids import normalise_subject_id
from adni_pu.errors import ConfigError, LeakageError, ManifestError, ResumeError
from adni_pu.workflows.evaluate import evaluate_run
from adni_pu.workflows.train import train_volumes
from adni_pu.workflows.volume_settings import load_volume_config

runner = CliRunner()


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    """The tiny model-grid cohort (19 subjects, 21 scans) and its manifest as text rows."""
    root = tmp_path_factory.mktemp("hostile") / "cohort"
    path = make_volume_cohort(root)
    return {"root": root, "manifest": path,
            "frame": pd.read_csv(path, dtype=str, keep_default_na=False)}


@pytest.fixture(scope="module")
def trained(cohort, tmp_path_factory):
    """A naive run of one epoch on the tiny cohort (with its RUN/scans.csv record)."""
    run = tmp_path_factory.mktemp("hostile-run") / "run"
    cfg = load_volume_config(None, tiny_overrides(1), preset="naive")
    train_volumes(cohort["manifest"], cfg, run, log=lambda m: None)
    return run


def _manifest(cohort, frame: pd.DataFrame, name: str) -> Path:
    path = cohort["root"] / name
    frame.to_csv(path, index=False)
    return path


def _cfg():
    return load_volume_config(None, tiny_overrides(1), preset="naive")


# --------------------------------------------------------------------------- 3: leakage


def test_canonical_id_covers_both_adni_spellings():
    assert normalise_subject_id("002_S_0004") == normalise_subject_id("sub-ADNI002S0004") \
        == "002_S_0004"


def test_train_refuses_a_test_scan_listed_in_train_under_another_id(cohort, tmp_path):
    frame = cohort["frame"]
    test = frame[frame["split"] == "test"].iloc[0]
    shutil.copy(cohort["root"] / test["scan_path"], cohort["root"] / "vol" / "copy.nii")
    extra = test.copy()
    extra[["subject_id", "scan_path", "split"]] = ["999_S_9999", "vol/copy.nii", "train"]
    path = _manifest(cohort, pd.concat([frame, extra.to_frame().T]), "leak_content.csv")
    with pytest.raises(LeakageError) as info:
        train_volumes(path, _cfg(), tmp_path / "run")
    text = str(info.value)
    for part in ("999_S_9999", test["subject_id"], "vol/copy.nii", test["scan_path"],
                 "['test', 'train']", f"line {len(frame) + 2}"):
        assert part in text, part
    assert not (tmp_path / "run").exists()  # refused before the run folder


def test_train_refuses_one_subject_spelled_two_ways_in_train_and_val(cohort, tmp_path):
    frame = cohort["frame"].copy()
    val = frame.index[frame["split"] == "val"][0]
    train = frame.index[frame["split"] == "train"][3]
    frame.loc[train, "subject_id"] = "002_S_0004"
    frame.loc[val, "subject_id"] = "sub-ADNI002S0004"
    path = _manifest(cohort, frame, "leak_id.csv")
    with pytest.raises(LeakageError, match=r"subject 002_S_0004: \['train', 'val'\]") as info:
        train_volumes(path, _cfg(), tmp_path / "run")
    assert "as 'sub-ADNI002S0004'" in str(info.value)
    assert not (tmp_path / "run").exists()


def test_evaluate_refuses_a_training_scan_under_another_id(cohort, trained, tmp_path):
    record = pd.read_csv(trained / "scans.csv", dtype=str)
    assert set(record["split"]) == {"train", "val"} and record["sha256"].str.startswith(
        "sha256:").all()
    frame = cohort["frame"]
    seen = frame[frame["split"] == "train"].iloc[2]
    shutil.copy(cohort["root"] / seen["scan_path"], tmp_path / "copy.nii")
    extra = seen.copy()
    extra[["subject_id", "scan_path", "split"]] = ["999_S_9999", str(tmp_path / "copy.nii"),
                                                   "test"]
    rows = frame.assign(scan_path=[str(cohort["root"] / p) for p in frame["scan_path"]])
    other = tmp_path / "other.csv"
    pd.concat([rows, extra.to_frame().T]).to_csv(other, index=False)
    with pytest.raises(LeakageError, match="same image") as info:
        evaluate_run(trained, "test", manifest=other, n_boot=0)
    assert "999_S_9999" in str(info.value) and seen["scan_path"] in str(info.value)
    assert "run's training split" in str(info.value)


def test_evaluate_of_a_run_without_its_scan_record_still_compares_canonical_ids(
        cohort, trained, tmp_path):
    run = tmp_path / "old-run"
    shutil.copytree(trained, run)
    (run / "scans.csv").unlink()  # a run made before the record existed
    frame = cohort["frame"]
    rows = frame.assign(scan_path=[str(cohort["root"] / p) for p in frame["scan_path"]])
    val = rows.index[rows["split"] == "val"][0]
    number = rows.loc[val, "subject_id"].replace("_S_", "S")
    rows.loc[val, ["subject_id", "split"]] = [f"sub-ADNI{number}", "test"]
    other = tmp_path / "other.csv"
    rows.to_csv(other, index=False)
    with pytest.raises(LeakageError, match="validation split, which chose the model"):
        evaluate_run(run, "test", manifest=other, n_boot=0)


# --------------------------------------------------------------------------- 5: contradictions


def _tiny(tmp_path: Path, rows: list[tuple[str, str, int, object, str]]) -> Path:
    path = tmp_path / "m.csv"
    pd.DataFrame(rows, columns=["subject_id", "scan_path", "pu_label", "truth", "split"]
                 ).to_csv(path, index=False)
    return path


def test_a_subject_with_two_pu_labels_is_refused_naming_its_lines(tmp_path):
    path = _tiny(tmp_path, [("002_S_0004", "a.nii", 1, 1, "train"),
                            ("003_S_0005", "b.nii", 0, 0, "train"),
                            ("sub-ADNI002S0004", "c.nii", 0, 1, "train")])
    with pytest.raises(ManifestError, match="column pu_label: expected one value per subject"
                       ) as info:
        read_manifest(path)
    text = str(info.value)
    assert "subject 002_S_0004: 1 on line 2, 0 on line 4 (as 'sub-ADNI002S0004')" in text


def test_a_subject_with_two_truths_is_refused_but_an_empty_truth_is_not(tmp_path):
    ok = _tiny(tmp_path, [("a", "a.nii", 0, 1, "train"), ("a", "b.nii", 0, "", "train")])
    assert len(read_manifest(ok)) == 2
    bad = _tiny(tmp_path, [("a", "a.nii", 0, 1, "train"), ("a", "b.nii", 0, 0, "train")])
    with pytest.raises(ManifestError, match="column truth: .*subject a: 1 on line 2, 0 on "
                                            "line 3"):
        read_manifest(bad)


def test_an_exact_duplicate_row_is_refused(tmp_path):
    path = _tiny(tmp_path, [("a", "a.nii", 1, 1, "train"), ("b", "b.nii", 0, 0, "val"),
                            ("a", "a.nii", 1, 1, "train")])
    with pytest.raises(ManifestError, match=r"the same row is given more than once \(lines "
                                            r"2, 4\).*count its scan twice"):
        read_manifest(path)


def test_one_scan_on_two_rows_is_refused(tmp_path):
    path = _tiny(tmp_path, [("a", "x/a.nii", 1, 1, "train"), ("b", "x/../x/a.nii", 0, 0,
                                                              "train")])
    with pytest.raises(ManifestError, match=r"expected each scan once; found the same scan "
                                            r"on several rows \(x/a.nii on lines 2, 3\)"):
        read_manifest(path)


# --------------------------------------------------------------------------- 14, 27, 20


@pytest.mark.parametrize("override, message", [
    ("train.lr=-0.01", "--set train.lr=-0.01: expected a number > 0, found -0.01"),
    ("train.lr=0", "--set train.lr=0: expected a number > 0, found 0"),
    ("train.beta=-1", "--set train.beta=-1: expected a number >= 0, found -1"),
    ("train.epochs=-1", "--set train.epochs=-1: expected an integer >= 1, found -1"),
    ("train.batch_size=0", "--set train.batch_size=0: expected an integer >= 2, found 0"),
    ("train.selfpu.ema_decay=1", "--set train.selfpu.ema_decay=1: expected a number in "
                                 "[0, 1), found 1"),
    ("bootstrap=-1", "--set bootstrap=-1: expected an integer >= 0, found -1"),
])
def test_settings_out_of_range_are_refused_in_one_line(override, message):
    with pytest.raises(ConfigError) as info:
        load_volume_config(None, [override])
    assert str(info.value) == message


def test_settings_made_directly_are_held_to_the_ranges_too():
    from adni_pu.pu.config import TrainConfig

    with pytest.raises(ConfigError, match="lr=-1: expected a number > 0, found -1"):
        TrainConfig(lr=-1)


@pytest.mark.parametrize("override, message", [
    ("lr=-1", "--set lr=-1: expected a number > 0, found -1"),
    ("beta=-1", "--set beta=-1: expected a number >= 0, found -1"),
])
def test_benchmark_settings_out_of_range_are_refused(override, message):
    from adni_pu.workflows.benchmark import BenchmarkSpec, resolve_config

    spec = BenchmarkSpec(dataset="mnist", method="nnpu", overrides=[override])
    with pytest.raises(ConfigError) as info:
        resolve_config(spec, seed=0)
    assert str(info.value) == message


def test_evaluate_bootstrap_below_zero_is_refused_before_any_work(tmp_path):
    result = runner.invoke(app, ["evaluate", str(tmp_path / "no-run"), "--bootstrap", "-1"])
    assert result.exit_code == 2
    assert result.output.strip() == "error: --bootstrap: expected an integer >= 0, found -1"


def test_a_bad_set_value_is_blamed_on_the_set_not_the_settings_file(tmp_path):
    fast = tmp_path / "fast.toml"
    fast.write_text("[train]\nepochs = 2\n")
    with pytest.raises(ConfigError) as info:
        load_volume_config(fast, ["prior=1.5"])
    assert str(info.value) == "--set prior=1.5: expected a number in (0, 1), found 1.5"
    fast.write_text("prior = 1.5\n")  # the file's own bad value is still the file's
    with pytest.raises(ConfigError, match=f"^{fast}: prior: expected a number in"):
        load_volume_config(fast, ["train.epochs=3"])


# --------------------------------------------------------------------------- 19


class _FailingTrainer:
    """A trainer whose first epoch fails (after the run folder's files are written)."""

    def __init__(self, *args, **kwargs):
        pass

    def check_resume(self):
        return None

    def fit(self):
        raise RuntimeError("failed in the first epoch")


def _fail_in_fit(monkeypatch):
    import adni_pu.pu.trainer
    import adni_pu.workflows.train as train_module

    monkeypatch.setattr(adni_pu.pu.trainer, "Trainer", _FailingTrainer)
    monkeypatch.setattr(train_module, "build_pu_data",  # no volumes read: seconds, not minutes
                        lambda frame, base, cfg, prior: None)


def test_a_train_failing_before_its_first_epoch_leaves_no_run_folder(cohort, tmp_path,
                                                                      monkeypatch):
    _fail_in_fit(monkeypatch)
    run = tmp_path / "runs" / "r1"
    with pytest.raises(RuntimeError, match="failed in the first epoch"):
        train_volumes(cohort["manifest"], _cfg(), run)
    assert not run.exists()
    mine = tmp_path / "mine"  # a folder that existed before is never removed
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    with pytest.raises(RuntimeError, match="failed in the first epoch"):
        train_volumes(cohort["manifest"], _cfg(), mine)
    assert (mine / "notes.txt").read_text() == "kept" and (mine / "run.json").is_file()


def test_a_run_folder_without_a_finished_epoch_is_reused_by_a_rerun(cohort, tmp_path,
                                                                     monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"manifest_sha256": "another manifest",
                                              "settings": {}}))
    (run / "metrics.csv").write_text("epoch,phase\n")  # a header, no epoch row
    _fail_in_fit(monkeypatch)  # got past the run folder check: fit was reached
    with pytest.raises(RuntimeError, match="failed in the first epoch"):
        train_volumes(cohort["manifest"], _cfg(), run)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.pt").write_bytes(b"a finished epoch")
    (run / "run.json").write_text(json.dumps({"manifest_sha256": "another manifest",
                                              "settings": {}}))
    with pytest.raises(ResumeError, match=r"another manifest or other settings "
                                          r"\(checkpoints/last.pt\).*reused by any rerun"):
        train_volumes(cohort["manifest"], _cfg(), run)


# --------------------------------------------------------------------------- 24, 28, 29


def _cohort_inputs(tmp_path: Path, extra_clinical=(), extra_scans=()):
    from test_cohort_build import clinical_rows, summary_rows, write_listed_volumes

    clinical = tmp_path / "ADNIMERGE.csv"
    clinical.write_text("\n".join([*clinical_rows(12), *extra_clinical]) + "\n")
    scans = tmp_path / "summary.csv"
    rows = [*summary_rows(12), *extra_scans]
    scans.write_text("\n".join(rows) + "\n")
    write_listed_volumes(tmp_path, rows)
    return clinical, scans


def test_next_hints_quote_paths_for_the_shell(tmp_path):
    from adni_pu.cli.preprocess import next_steps

    out = tmp_path / "my prep's out"
    text = next_steps(out)
    assert f"adni-pu qc {shlex.quote(str(out))}" in text
    clinical, scans = _cohort_inputs(tmp_path)
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


def test_cohort_build_leaves_out_ids_that_are_paths(tmp_path):
    clinical, scans = _cohort_inputs(
        tmp_path, ["50,../../x,bl,2010-01-03,AD,Dementia,70,Male,1.3,,",
                   "51,/etc/x,bl,2010-01-03,CN,CN,70,Male,1.0,,"],
        ["../../x,M000,/raw/a.nii,done,a.nii.gz,,1", "/etc/x,M000,/raw/b.nii,done,b.nii.gz,,1"])
    out = tmp_path / "out"
    result = runner.invoke(app, ["cohort", "build", str(clinical), str(scans), str(out)])
    assert result.exit_code == 0, result.output
    assert "scan_unusable_id: 2 scans whose subject id is not an id" in result.output
    manifest = pd.read_csv(out / "manifest.csv", dtype=str)
    assert not manifest["scan_id"].str.contains("/|\\.\\.", regex=True).any()
    excluded = pd.read_csv(out / "excluded.csv", dtype=str)
    assert set(excluded["subject"]) >= {"../../x", "/etc/x"}
    assert set(excluded.loc[excluded["subject"].isin(["../../x", "/etc/x"]), "reason"]) == {
        "subject id is not an id (a path or odd characters)"}


# --------------------------------------------------------------------------- 30b


def test_demo_refuses_a_cohort_too_small_for_its_folds_before_any_scan(tmp_path):
    out = tmp_path / "demo"
    result = runner.invoke(app, ["demo", "--subjects", "18", "--out", str(out)])
    assert result.exit_code == 2
    text = result.output.strip()
    assert text.startswith("error: --subjects 18: fold ") and "has no labelled positive" in text
    assert "the smallest --subjects that works with --folds 2 and --seed 0 is 32" in text
    assert not out.exists()  # nothing generated, nothing preprocessed


def test_the_composition_check_agrees_with_the_folds_the_demo_builds():
    from adni_pu.workflows.crossval import fold_frames
    from adni_pu.workflows.demo import (
        DemoSettings,
        check_composition,
        fold_composition,
        synthetic_manifest,
    )

    settings = DemoSettings(subjects=32)
    check_composition(settings)  # the smallest that works: accepted
    for n in (18, 32):  # one large build, cut to n subjects, gives the n-subject cohort
        alone, _ = synthetic_manifest(settings, n)
        big, ids = synthetic_manifest(settings, 40)
        cut = big[big["subject_id"].isin(ids[:n])].reset_index(drop=True)
        assert sorted(alone["subject_id"]) == sorted(cut["subject_id"])
        assert (fold_composition(fold_frames(alone, 2, 0)) is None) == (n == 32)
