"""``benchmarks/paper_scale.py``: the reference lines on each seed's split, nnPU with the
estimated prior as a method, and the table's rows for both (tiny synthetic inputs)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from adni_pu.pu.metrics import binary_metrics, bootstrap_ci
from benchmarks import paper_scale
from benchmarks.common import prepare_cohort

SUBJECTS = 16


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A prepared cohort of 16 subjects (the generator's ideal volumes), CN/AD-heavy so that
    a small split holds labelled positives, as ``paper_scale.py prepare`` writes it."""
    from adni_pu.workflows.demo import DemoSettings

    out = tmp_path_factory.mktemp("paper-scale")
    settings = DemoSettings(subjects=SUBJECTS, out=out, preprocessing="ideal", workers=1,
                            overrides=("synth.dx_proportions=[0.4, 0.05, 0.05, 0.1, 0.4]",))
    prepare_cohort(settings, {"subjects": SUBJECTS, "cohort_seed": 0,
                              "synth": settings.synth, "workers": 1})
    return out


def _main(monkeypatch, *argv: str) -> None:
    monkeypatch.setattr("sys.argv", ["paper_scale.py", *map(str, argv)])
    paper_scale.main()


def test_best_threshold_maximises_accuracy_on_the_given_subjects() -> None:
    scores = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert paper_scale.best_threshold(scores, [0, 0, 0, 1, 1, 1]) == pytest.approx(0.35)
    # one error either way: the lowest best cut; unknown truth is left out
    cut = paper_scale.best_threshold([*scores, 0.05], [0, 1, 0, 1, 1, 1, np.nan])
    assert cut == pytest.approx(0.15)
    assert paper_scale.best_threshold([0.2, 0.1], [1, 1]) < 0.1  # everyone positive


def test_references_score_the_runs_held_out_subjects(work: Path, tmp_path: Path,
                                                       monkeypatch) -> None:
    """The reference step's held-out subjects are those ``run`` trains around (the same
    cohort stage, seed and fractions); the truth line is the generator's hippocampal loss
    cut on the training subjects, so its AUC is the raw loss's on the test subjects."""
    from adni_pu.cohort import read_manifest
    from adni_pu.workflows.demo import cohort_stage

    monkeypatch.setattr(paper_scale, "TEST_SUBJECTS", 4)
    results = tmp_path / "results"
    _main(monkeypatch, "references", "--work", work, "--seed", 1, "--results", results,
          "--boot", 20)
    record = json.loads((results / "reference-seed1.json").read_text())
    info = json.loads((work / "prepared.json").read_text())
    _, path = cohort_stage(tmp_path / "cohort", work / "synth", Path(info["summary"]), 1,
                           print, test_fraction=4 / SUBJECTS,
                           val_fraction=paper_scale.VAL_FRACTION)
    manifest = read_manifest(path)
    test = manifest[manifest["split"].astype(str) == "test"]
    assert set(record["references"]) == {paper_scale.LOGISTIC, paper_scale.TRUTH}
    for line in record["references"].values():
        assert sorted(p["subject_id"] for p in line["predictions"]) == sorted(
            test["subject_id"])
        assert {"accuracy", "auc", "hidden_positive_recall", "specificity"} <= set(
            line["metrics"])
    assert record["cohort"]["splits"]["test"]["subjects"] == len(test)
    truth = pd.read_csv(work / "synth" / "truth_scans.csv", dtype={"subject_id": str})
    loss = truth.groupby("subject_id")["hippocampal_loss"].mean()
    line = record["references"][paper_scale.TRUTH]
    preds = pd.DataFrame(line["predictions"]).dropna(subset=["truth"])
    raw = binary_metrics(loss[preds["subject_id"]].to_numpy(), preds["truth"].to_numpy())
    assert line["metrics"]["auc"]["value"] == pytest.approx(raw["auc"])
    cut = line["threshold"]["hippocampal_loss"]
    assert np.allclose(preds["logit"], loss[preds["subject_id"]].to_numpy() - cut)
    assert (work / "volume_features.csv").is_file()  # measured once, kept for every seed

    # a method's results file of seed 1 that held out other subjects is refused
    other = {"result": {"predictions": [{"subject_id": "x"}]}}
    (results / "nnpu-seed1.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="nnpu-seed1.json: holds out 1 other subjects"):
        _main(monkeypatch, "references", "--work", work, "--seed", 1, "--results", results,
              "--boot", 20)


def test_estimated_prior_method_is_nnpu_with_prior_estimate_over_the_demo_prior() -> None:
    """``nnpu-estimated`` trains the nnpu preset with ``prior = "estimate"``, also where the
    demo's settings carry a prior of their own; a user's prior would contradict its name."""
    from adni_pu.workflows.demo_policy import method_settings
    from adni_pu.workflows.volume_settings import load_volume_config

    preset, overrides = paper_scale.method_run("nnpu-estimated", ["train.epochs=2"])
    assert preset == "nnpu" and overrides == ["train.epochs=2", 'prior="estimate"']
    values = method_settings(8, 0, 1, Path("cache"), {"prior": 0.3})
    cfg = load_volume_config(None, overrides, preset=preset, values=values)
    assert cfg.prior == "estimate" and cfg.train.method == "nnpu" and cfg.train.epochs == 2
    assert paper_scale.method_run("nnpu", ["prior=0.4"]) == ("nnpu", ["prior=0.4"])
    for clash in ("prior=0.4", "train.prior=0.4"):
        with pytest.raises(SystemExit, match=f"--set {clash} would change it"):
            paper_scale.method_run("nnpu-estimated", [clash])


def test_estimated_prior_run_records_the_estimate_beside_the_true_prior(
        work: Path, tmp_path: Path, monkeypatch) -> None:
    """``run --method nnpu-estimated`` (one epoch): the results file carries the estimate
    the nnPU run trained with, its CI and the training split's true prior; its run folder
    is its own, not nnpu's. The tiny cohort is below the estimate's minimum counts, which
    are lowered here (the rules themselves: tests/test_class_prior.py)."""
    from adni_pu.workflows import class_prior

    monkeypatch.setattr(class_prior, "MIN_LABELLED_VAL", 1)
    monkeypatch.setattr(class_prior, "MIN_UNLABELLED_VAL", 1)
    monkeypatch.setattr(class_prior, "collapse_reason", lambda record: None)
    monkeypatch.setattr(paper_scale, "TEST_SUBJECTS", 4)
    monkeypatch.chdir(tmp_path)  # the run's work folder is given; nothing lands elsewhere
    results = tmp_path / "results"
    _main(monkeypatch, "run", "--work", work, "--method", "nnpu-estimated", "--seed", 2,
          "--epochs", 1, "--threads", 1, "--results", results)
    record = json.loads((results / "nnpu-estimated-seed2.json").read_text())
    assert record["preset"] == "nnpu" and record["overrides"] == ['prior="estimate"']
    est = record["prior_estimate"]
    assert est["prior_trained_with"]["prior"] == est["value"]
    assert est["true_prior"] == pytest.approx(
        record["cohort"]["splits"]["train"]["class_prior"])
    assert est["error"] == pytest.approx(est["value"] - est["true_prior"])
    assert est["ci_low"] <= est["value"] <= est["ci_high"]
    run_dir = work / "runs" / "nnpu-estimated-seed2"
    assert (run_dir / "prior_estimate" / "best_model.pt").is_file()
    assert not (work / "runs" / "nnpu-seed2").exists()


def test_prior_estimate_record_reads_the_run_folder(tmp_path: Path) -> None:
    estimate = {"value": 0.5, "ci_low": 0.42, "ci_high": 0.55, "method": "bbe",
                "true_prior": 0.46}
    (tmp_path / "prior_estimate.json").write_text(json.dumps(estimate))
    used = {"prior": 0.5, "source": "estimate (prior_estimate.json)"}
    (tmp_path / "run.json").write_text(json.dumps({"prior": used}))
    record = paper_scale.prior_estimate_record(tmp_path)
    assert record["error"] == pytest.approx(0.04) and record["ci_holds_true_prior"]
    assert record["prior_trained_with"] == used
    assert paper_scale.prior_estimate_record(tmp_path / "given") is None


def _method_file(results: Path, method: str, seed: int, logits: list[float],
                 **extra) -> None:
    truth = [1, 1, 1, 1, 0, 0, 0, 0]
    pu = [1, 0, 0, 0, 0, 0, 0, 0]
    split = {"subjects": 8, "n_p": 1, "class_prior": 0.5, "hidden_positive": 3,
             "hidden_share": 0.75, "truth_positive": 4}
    preds = [{"subject_id": f"s{i}", "pu_label": p, "logit": x, "truth": t}
             for i, (p, x, t) in enumerate(zip(pu, logits, truth))]
    metrics = bootstrap_ci(logits, truth, (*paper_scale.TABLE_METRICS, "all_negative_accuracy",
                                           "all_positive_accuracy"), n_boot=20, pu_label=pu)
    record = {"seed": seed, "wall_s": 60.0, "machine": "test", "data": "toy",
              "cohort": {"subjects": 8, "cohort_seed": 0,
                         "splits": {"train": split, "test": split}},
              "metrics": metrics, "result": {"predictions": preds}, **extra}
    (results / f"{method}-seed{seed}.json").write_text(json.dumps(record))


def test_table_shows_reference_lines_and_the_estimated_prior(tmp_path: Path,
                                                             monkeypatch) -> None:
    results = tmp_path / "results"
    results.mkdir()
    nnpu = [2.0, 1.0, 1.0, -1.0, -2.0, -2.0, -2.0, 1.0]       # accuracy 6/8
    estimated = [2.0, 1.0, 1.0, 1.0, -2.0, -2.0, 1.0, 1.0]   # 6/8, every hidden positive
    for seed, (value, low, high, true) in enumerate(((0.50, 0.40, 0.60, 0.46),
                                                     (0.30, 0.25, 0.35, 0.46))):
        _method_file(results, "nnpu", seed, nnpu)
        _method_file(results, "nnpu-estimated", seed, estimated, prior_estimate={
            "value": value, "ci_low": low, "ci_high": high, "method": "bbe",
            "true_prior": true, "classifier": {"val_pu_auc": 0.7}})
    truth = [1, 1, 1, 1, 0, 0, 0, 0]
    for seed, acc_logits in ((0, [1, 1, 1, 1, -1, -1, -1, -1]),     # accuracy 1
                             (1, [1, 1, 1, -1, -1, -1, -1, 1])):    # accuracy 0.75
        lines = {name: {"metrics": bootstrap_ci(acc_logits, truth, paper_scale.TABLE_METRICS,
                                                n_boot=20, pu_label=[1, 0, 0, 0, 0, 0, 0, 0])}
                 for name in (paper_scale.LOGISTIC, paper_scale.TRUTH)}
        (results / f"reference-seed{seed}.json").write_text(json.dumps(
            {"seed": seed, "wall_s": 30.0, "machine": "test", "references": lines}))
    out = tmp_path / "table.md"
    _main(monkeypatch, "table", "--results", results, "--out", out, "--boot", 50)
    text = out.read_text()
    assert "| nnpu-estimated | 0-1 | 75.0 (0.0) | 81.2 (0.0) |" in text  # AUC 13/16
    assert " | - | 1 | test |" in text   # no paper accuracy for the new method
    for name in (paper_scale.LOGISTIC, paper_scale.TRUTH):
        assert f"| *reference: {name}* | 0-1 | 87.5 (17.7) | " in text
    assert "| nnpu-estimated - nnpu | hidden positive recall | +33.3 [" in text
    assert "| 0 | 0.460 | 0.500 [0.400, 0.600] | +0.040 | yes | 0.700 |" in text
    assert "| 1 | 0.460 | 0.300 [0.250, 0.350] | -0.160 | no | 0.700 |" in text
    assert "Mean absolute error 0.100 over 2 seed(s) (mean error -0.060); the CI held " \
           "the true prior on 1 of 2." in text
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["prior_estimation"]["ci_holds_true_prior"] == 1
    assert record["references"][paper_scale.TRUTH]["accuracy"]["mean"] == pytest.approx(0.875)
    assert record["methods"]["nnpu-estimated"]["seeds"] == [0, 1]


def test_table_beside_another_cohort_pairs_each_method_with_itself(tmp_path: Path,
                                                                   monkeypatch) -> None:
    """``table --beside``: each method against itself in another results folder of the same
    subjects (preprocessed scans against ideal volumes), on the seeds and held-out subjects
    both have; a subject scored on one side only is left out and counted."""
    real, ideal = tmp_path / "real", tmp_path / "ideal"
    for folder in (real, ideal):
        folder.mkdir()
    calls_all_positive = [2.0, 1.0, 1.0, 1.0, -2.0, -2.0, -2.0, -2.0]   # accuracy 8/8
    misses_two = [2.0, 1.0, -1.0, -1.0, -2.0, -2.0, -2.0, -2.0]        # accuracy 6/8
    for seed in (0, 1):
        _method_file(ideal, "nnpu", seed, calls_all_positive, data="cohort (ideal)")
        _method_file(ideal, "naive", seed, misses_two, data="cohort (ideal)")
    _method_file(real, "nnpu", 0, misses_two, data="cohort (real)")    # no seed 1 here
    # a subject the real side did not score (a scan that failed preprocessing), and one
    # without a truth (no PET), paired but left out of every metric
    record = json.loads((real / "nnpu-seed0.json").read_text())
    record["result"]["predictions"] = record["result"]["predictions"][:-1]
    record["result"]["predictions"][6]["truth"] = None
    (real / "nnpu-seed0.json").write_text(json.dumps(record))
    out = tmp_path / "table.md"
    _main(monkeypatch, "table", "--results", real, "--out", out, "--boot", 50,
          "--beside", ideal)
    text = out.read_text()
    # the 6 common subjects with a truth: 4/6 against 6/6; hidden recall 1/3 against 3/3
    assert "| nnpu: real - ideal | accuracy | -33.3 [" in text
    assert "| nnpu: real - ideal | hidden positive recall | -66.7 [" in text
    # seed 0 only; the 7 subjects both scored, 6 of them with a truth
    assert "| 0 | 7 of 7 / 8 (6 with a truth) |" in text
    assert "naive:" not in text        # no naive run on the real side
    beside = json.loads(out.with_suffix(".json").read_text())["beside"]
    assert [d["pair"] for d in beside["paired"]] == ["nnpu: real - ideal"] * 3
    assert beside["results"] == str(ideal)
    with pytest.raises(SystemExit, match="no results files"):
        _main(monkeypatch, "table", "--results", real, "--out", out, "--beside",
              tmp_path / "empty")


def test_seed_lists_and_machine_cells_are_compact_and_unambiguous():
    assert paper_scale.seed_list([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8"
    assert paper_scale.seed_list([3]) == "3"
    cpu, gpu = "2-core CPU VM, no GPU; torch threads 1", "H100; 8 pieces at a time"
    recs = [{"seed": s, "machine": cpu} for s in (0, 1, 2, 9)]
    assert paper_scale.machine_cell(recs) == cpu
    recs += [{"seed": s, "machine": gpu} for s in range(3, 9)]
    assert paper_scale.machine_cell(recs) == f"{cpu} (seeds 0-2, 9) / {gpu} (seeds 3-8)"


FAKE_PYTHON = """#!/usr/bin/env bash
# stands in for the interpreter: "-m benchmarks.paper_scale STEP ARGS"; a run logs itself and
# writes its results file, but naive seed 1 fails
step=$3; shift 3
[ "$step" = run ] || exit 0
while [ $# -gt 0 ]; do
  case $1 in --results) r=$2;; --method) m=$2;; --seed) s=$2;; --threads) t=$2;; esac; shift
done
echo "$m-$s threads $t" >> "$r/started.txt"
[ "$m-$s" = naive-1 ] && exit 3
echo '{}' > "$r/$m-seed$s.json"
"""


def test_cpu_job_runs_each_missing_piece_once_and_goes_on_past_a_failure(tmp_path: Path) -> None:
    """``benchmarks/jobs/paper-scale-cpu.sh``: two workers share one list (seed by seed, the
    methods in METHODS' order), skip pieces whose results file exists, run each other piece
    exactly once with one thread, and report a failed piece without stopping the rest."""
    import subprocess

    work, results = tmp_path / "work", tmp_path / "results"
    work.mkdir()
    results.mkdir()
    (work / "prepared.json").write_text("{}")
    (results / "nnpu-seed0.json").write_text("{}")     # done before: skipped
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    script = Path(paper_scale.__file__).parent / "jobs" / "paper-scale-cpu.sh"
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(fake), "RESULTS": str(results),
           "METHODS": "selfpu naive nnpu"}
    done = subprocess.run(["bash", str(script), str(work), "0", "1"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    started = sorted((results / "started.txt").read_text().split("\n")[:-1])
    assert started == sorted(f"{job} threads 1" for job in
                             ("selfpu-0", "naive-0", "selfpu-1", "naive-1", "nnpu-1"))
    assert "failed: naive-1" in done.stderr
    assert sorted(p.name for p in results.glob("*-seed*.json")) == [
        "naive-seed0.json", "nnpu-seed0.json", "nnpu-seed1.json", "selfpu-seed0.json",
        "selfpu-seed1.json"]


def test_a_piece_waits_for_another_piece_writing_its_seeds_cohort(tmp_path: Path) -> None:
    """Two pieces of one seed build the same cohort folder: the second waits for the first's
    lock instead of failing (2026-11-29: naive seed 0 failed so beside Self-PU seed 0), and
    gives up with the lock's error when the holder never lets go."""
    import threading

    from adni_pu.errors import OutputLockedError
    from adni_pu.locking import output_lock
    from benchmarks.common import when_free

    folder = tmp_path / "cohort-seed0"
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with output_lock(folder, "first piece"):
            held.set()
            release.wait(10)

    attempts = []

    def write() -> str:
        attempts.append(1)
        if len(attempts) == 3:
            release.set()       # the first piece finishes while the second waits
        with output_lock(folder, "second piece"):
            return "written"

    first = threading.Thread(target=holder)
    first.start()
    held.wait(10)
    assert when_free(write, wait_s=30, every_s=0.05) == "written"
    first.join()
    assert len(attempts) >= 3   # refused at least twice, then written

    held.clear()
    release.clear()
    first = threading.Thread(target=holder)
    first.start()
    held.wait(10)
    def write_plainly() -> None:
        attempts.append(1)
        with output_lock(folder, "second piece"):
            pass

    attempts.clear()
    with pytest.raises(OutputLockedError, match="in use by pid"):
        when_free(write_plainly, wait_s=0.2, every_s=0.05)
    assert len(attempts) >= 2
    release.set()
    first.join()
