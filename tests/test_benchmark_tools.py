"""The maintainers' benchmark tools: the parallel job runner's job files and packing, and the
validation summary that the tuning log's decisions read."""

from __future__ import annotations

import csv
import importlib.util
import json
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _metrics(path: Path, rows: list[dict[str, object]]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with (path / "metrics.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, keys)
        writer.writeheader()
        writer.writerows(rows)


def test_read_jobs_parses_names_and_arguments(tmp_path: Path) -> None:
    runner = _script("parallel_runs")
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("# comment\n\na mnist --method nnpu --set 'x=1 2'  # tail\nb mnist\n")
    assert runner.read_jobs(jobs) == [("a", ["mnist", "--method", "nnpu", "--set", "x=1 2"]),
                                      ("b", ["mnist"])]
    jobs.write_text("a mnist\na mnist\n")
    with pytest.raises(SystemExit, match="repeat"):
        runner.read_jobs(jobs)
    jobs.write_text("lonely\n")
    with pytest.raises(SystemExit, match="jobs.txt:1"):
        runner.read_jobs(jobs)


def test_pack_keeps_small_files_and_leaves_checkpoints_out(tmp_path: Path) -> None:
    runner = _script("parallel_runs")
    runs = tmp_path / "runs"
    seed = runs / "job" / "seed0"
    seed.mkdir(parents=True)
    for name in ("metrics.csv", "result.json", "last.pt"):
        (seed / name).write_text("x")
    (runs / "job.log").write_text("log")
    target = tmp_path / "out" / "runs.tar.xz"
    runner.pack(runs, target, with_checkpoints=False)
    with tarfile.open(target) as tar:
        names = sorted(tar.getnames())
    assert names == ["runs/job.log", "runs/job/seed0/metrics.csv", "runs/job/seed0/result.json"]
    runner.pack(runs, target, with_checkpoints=True)
    with tarfile.open(target) as tar:
        assert "runs/job/seed0/last.pt" in tar.getnames()


def test_val_summary_reads_validation_for_both_rules(tmp_path: Path) -> None:
    summary_mod = _script("val_summary")
    seed = tmp_path / "root" / "run" / "seed0"
    rows = [
        {"epoch": 0, "val/student1/pu_risk": 0.30, "val/student2/pu_risk": 0.20,
         "selected/candidate": "student2", "selected/score": 0.20,
         "test_diagnostic/student1/accuracy": 0.90, "test_diagnostic/student2/accuracy": 0.80,
         "train/student1/nn_correction": 0.5, "train/student2/nn_correction": 0.0},
        {"epoch": 1, "val/student1/pu_risk": 0.10, "val/student2/pu_risk": 0.25,
         "val/teacher1/pu_risk": 0.15, "val/teacher2/pu_risk": 0.12,
         "selected/candidate": "teacher2", "selected/score": 0.12,
         "test_diagnostic/student1/accuracy": 0.99, "test_diagnostic/teacher1/accuracy": 0.95,
         "test_diagnostic/teacher2/accuracy": 0.85,
         "train/student1/nn_correction": 1.0, "train/student2/nn_correction": 0.5,
         "trusted/student1/prior_rest": 0.45},
    ]
    rows[0]["trusted/student1/prior_rest"] = 0.49
    _metrics(seed, rows)
    out = summary_mod.summarise([tmp_path / "root"])["run"]["seed0"]
    assert out["complete"] is False and out["epochs_done"] == 2
    # the best selected score over the run, not the best test number
    assert out["best_epoch_rule"] == {"epoch": 1, "model": "teacher2", "val_score": 0.12,
                                      "test_accuracy": 0.85}
    # final rule: teachers only (students no longer compete), lowest validation risk wins
    assert out["final_rule"]["model"] == "teacher2"
    assert out["final_rule"]["val_scores"] == {"teacher1": 0.15, "teacher2": 0.12}
    assert out["final_rule"]["test_accuracy_each"] == {"teacher1": 0.95, "teacher2": 0.85}
    assert out["nn_correction_share"] == pytest.approx(0.5)
    assert out["test_accuracy_test_selected"] == 0.99
    assert out["prior_rest_at_selections"] == {"0": {"student1": 0.49}, "1": {"student1": 0.45}}
    text = summary_mod.markdown({"run": {"seed0": out}})
    assert "| run | seed0 | 2 (cut short) | 0.1200 (1, teacher2) |" in text
    json.dumps(out)  # serialisable as the tuning log's JSON


def test_val_summary_takes_the_trainers_own_finalists_when_recorded(tmp_path: Path) -> None:
    summary_mod = _script("val_summary")
    seed = tmp_path / "root" / "run" / "seed0"
    _metrics(seed, [{"epoch": 0, "val/teacher1/pu_risk": 0.15, "val/teacher2/pu_risk": 0.12,
                     "selected/candidate": "teacher2", "selected/score": 0.12,
                     "test_diagnostic/teacher1/accuracy": 0.95,
                     "test_diagnostic/teacher2/accuracy": 0.85}])
    (seed / "selection.json").write_text(json.dumps({
        "val_criterion": "pu_risk", "finalists": {
            "epoch": 0, "choice": "average",
            "val_scores": {"teacher1": 0.15, "teacher2": 0.12, "average": 0.11}}}))
    (seed / "result.json").write_text(json.dumps({"test_accuracy_finalists_diagnostic": {
        "teacher1": 0.95, "teacher2": 0.85, "average": 0.91}}))
    final = summary_mod.summarise([tmp_path / "root"])["run"]["seed0"]["final_rule"]
    assert final["model"] == "average" and final["val_score"] == 0.11
    assert final["test_accuracy"] == 0.91


def test_parallel_runs_reports_failed_jobs_and_logs_them(tmp_path: Path, monkeypatch) -> None:
    runner = _script("parallel_runs")
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("ok mnist '#not-a-comment'\nbad mnist\n")
    assert runner.read_jobs(jobs)[0] == ("ok", ["mnist", "#not-a-comment"])
    calls = []

    def fake_call(cmd, stdout, stderr, env):  # the benchmark command, without running it
        calls.append(cmd)
        return 0 if "ok" in cmd[-1] else 2

    monkeypatch.setattr(runner.subprocess, "call", fake_call)
    runs = tmp_path / "runs"
    monkeypatch.setattr("sys.argv", ["parallel_runs.py", str(jobs), "--runs", str(runs)])
    assert runner.main() == 1  # one job failed
    log = (runs / "parallel_runs.log").read_text()
    assert "ok: done" in log and "bad: failed (exit 2)" in log
    assert calls[0][-2:] == ["--out", str(runs / "ok")]
    monkeypatch.setattr("sys.argv", ["parallel_runs.py", str(jobs), "--only", "nope"])
    with pytest.raises(SystemExit, match="nope"):
        runner.main()


def test_demo_tune_compare_pairs_runs_and_subjects(tmp_path: Path) -> None:
    """``demo_tune.py --compare``: candidates pair on (method, cohort, training seed, cohort
    size) runs and on subjects; the score is the mean of per-run held-out AUCs; the paired CI of a
    difference that holds in every resample excludes 0."""
    tune = _script("demo_tune")
    truth = [0, 0, 0, 1, 1, 1]
    perfect = [[f"s{i}", float(t), t] for i, t in enumerate(truth)]
    inverted = [[f"s{i}", -float(t), t] for i, t in enumerate(truth)]
    half = [[f"s{i}", float(i % 2), t] for i, t in enumerate(truth)]  # AUC 6/9 (ties half)
    records = [
        {"method": "nnpu", "name": "good", "cohort_seed": 100, "overrides": [],
         "heldout_predictions": perfect},
        {"method": "nnpu", "name": "goodt1", "cohort_seed": 100, "overrides": ["train.seed=1"],
         "heldout_predictions": perfect},
        {"method": "nnpu", "name": "bad", "cohort_seed": 100, "overrides": [],
         "heldout_predictions": inverted},
        {"method": "nnpu", "name": "badt1", "cohort_seed": 100, "overrides": ["train.seed = 1"],
         "heldout_predictions": half},
        # no twin in "good": left out of the pairing
        {"method": "nnpu", "name": "bad", "cohort_seed": 101, "overrides": [],
         "heldout_predictions": half},
        {"method": "nnpu", "name": "other", "cohort_seed": 100, "overrides": [],
         "val_auc_pooled": 0.5},
        # another cohort of the same seed (96 subjects): never paired with the 48-subject one
        {"method": "nnpu", "name": "big", "cohort_seed": 100, "subjects": 96,
         "overrides": [], "heldout_predictions": perfect},
        # the same cohort and seeds but another method: never paired with nnPU's
        {"method": "naive", "name": "naiveonly", "cohort_seed": 100, "overrides": [],
         "heldout_predictions": perfect},
    ]
    log = tmp_path / "tuning.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tune.compare(log, ["good", "goodt1"], ["bad", "badt1"], n_boot=200)
    assert out["runs"] == [["nnpu", 100, 1, 48], ["nnpu", 100, 100, 48]]
    assert out["heldout_auc_first"] == 1.0
    assert out["heldout_auc_second"] == pytest.approx((0.0 + 6 / 9) / 2, abs=1e-4)
    assert out["difference"] == pytest.approx(1 - 1 / 3, abs=1e-4)
    assert out["difference_ci95"][0] > 0
    assert out["share_above_0"] == 1.0
    with pytest.raises(SystemExit, match="no run"):
        tune.compare(log, ["good"], ["other"])
    with pytest.raises(SystemExit, match="no run"):
        tune.compare(log, ["big"], ["bad"])
    with pytest.raises(SystemExit, match="no run"):
        tune.compare(log, ["naiveonly"], ["bad"])


def _demo_record(seed: int, shift: float) -> dict:
    """A demo.json of one seed: methods and reference lines scoring the same 8 subjects."""
    truth = [0, 0, 0, 0, 1, 1, 1, 1]

    def preds(logits: list[float]) -> list[dict]:
        return [{"subject_id": f"s{i}", "logit": v, "truth": t}
                for i, (v, t) in enumerate(zip(logits, truth))]

    def entry(logits: list[float], auc: float) -> dict:
        return {"predictions": preds(logits), "nn_correction": 0.0, "pooled": {
            "n_scored": 8, "n_positive": 4,
            "metrics": {"auc": {"value": auc, "ci_low": auc - 0.2, "ci_high": auc + 0.1}}}}

    good = [0.0, 0.1, 0.2, 0.3, 1.0, 1.1, 1.2, 1.3]  # AUC 1
    poor = [1.0, 0.1, 0.2, 0.3, 0.0, 1.1, 1.2, 1.3]  # 4 of 16 pairs misordered: AUC 0.75
    results = {"naive": entry(poor, 0.75), "upu": entry(poor, 0.75),
               "nnpu": entry(good, 1.0), "selfpu": entry(good, 1.0)}
    refs = {"logistic regression on 2 volumes": entry(poor, 0.75)}
    return {"settings": {"seed": seed}, "times_s": {"total": 60.0 + shift},
            "results": results, "references": refs}


def test_demo_seeds_table_has_mean_row_and_paired_rows_with_the_reference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    seeds = _script("demo_seeds")
    runs = []
    for seed in (0, 1):
        run = tmp_path / f"demo-seed{seed}"
        run.mkdir()
        (run / "demo.json").write_text(json.dumps(_demo_record(seed, 60.0 * seed)))
        runs.append(str(run))
    (tmp_path / "demo-seed0.time").write_text("Elapsed (wall clock) time (h:mm:ss or m:ss): 8:30.00\n")
    monkeypatch.setattr("sys.argv", ["demo_seeds.py", "--runs", *runs, "--name", "t",
                                     "--out-dir", str(tmp_path)])
    seeds.main()
    table = (tmp_path / "t.md").read_text()
    record = json.loads((tmp_path / "t.json").read_text())
    assert [s["wall_s"] for s in record["seeds"]] == [510.0, 120.0]  # /usr/bin/time, then total
    assert "| mean (std) | 5.2 min | 16 in all | 0.750 (0.000) |" in table
    pairs = {d["pair"]: d for d in record["paired"]}
    assert list(pairs) == ["selfpu - nnpu", "nnpu - naive", "nnpu - upu", "selfpu - naive",
                           "selfpu - logistic regression on 2 volumes",
                           "nnpu - logistic regression on 2 volumes"]
    assert pairs["selfpu - nnpu"]["value"] == 0.0
    assert pairs["nnpu - naive"]["value"] == pytest.approx(0.25)
    assert pairs["selfpu - logistic regression on 2 volumes"]["n_subjects"] == 16
