"""The maintainers' benchmark tools: the parallel job runner's job files and packing, and the
validation summary that the tuning log's decisions read."""

from __future__ import annotations

import csv
import json
import tarfile
from pathlib import Path

import pytest

from benchmarks import demo_seeds, demo_tune, paper_scale, parallel_runs, selection_rules, val_summary


def _metrics(path: Path, rows: list[dict[str, object]]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with (path / "metrics.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, keys)
        writer.writeheader()
        writer.writerows(rows)


def test_read_jobs_parses_names_and_arguments(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("# comment\n\na mnist --method nnpu --set 'x=1 2'  # tail\nb mnist\n")
    assert parallel_runs.read_jobs(jobs) == [
        ("a", ["mnist", "--method", "nnpu", "--set", "x=1 2"]), ("b", ["mnist"])]
    jobs.write_text("a mnist\na mnist\n")
    with pytest.raises(SystemExit, match="repeat"):
        parallel_runs.read_jobs(jobs)
    jobs.write_text("lonely\n")
    with pytest.raises(SystemExit, match="jobs.txt:1"):
        parallel_runs.read_jobs(jobs)


def test_pack_keeps_small_files_and_leaves_checkpoints_out(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    seed = runs / "job" / "seed0"
    seed.mkdir(parents=True)
    for name in ("metrics.csv", "result.json", "last.pt"):
        (seed / name).write_text("x")
    (runs / "job.log").write_text("log")
    target = tmp_path / "out" / "runs.tar.xz"
    parallel_runs.pack(runs, target, with_checkpoints=False)
    with tarfile.open(target) as tar:
        names = sorted(tar.getnames())
    assert names == ["runs/job.log", "runs/job/seed0/metrics.csv", "runs/job/seed0/result.json"]
    parallel_runs.pack(runs, target, with_checkpoints=True)
    with tarfile.open(target) as tar:
        assert "runs/job/seed0/last.pt" in tar.getnames()


def test_val_summary_reads_validation_for_both_rules(tmp_path: Path) -> None:
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
    out = val_summary.summarise([tmp_path / "root"])["run"]["seed0"]
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
    text = val_summary.markdown({"run": {"seed0": out}})
    assert "| run | seed0 | 2 (cut short) | 0.1200 (1, teacher2) |" in text
    json.dumps(out)  # serialisable as the tuning log's JSON


def test_val_summary_takes_the_trainers_own_finalists_when_recorded(tmp_path: Path) -> None:
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
    final = val_summary.summarise([tmp_path / "root"])["run"]["seed0"]["final_rule"]
    assert final["model"] == "average" and final["val_score"] == 0.11
    assert final["test_accuracy"] == 0.91


def test_parallel_runs_reports_failed_jobs_and_logs_them(tmp_path: Path, monkeypatch) -> None:
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("ok mnist '#not-a-comment'\nbad mnist\n")
    assert parallel_runs.read_jobs(jobs)[0] == ("ok", ["mnist", "#not-a-comment"])
    calls = []

    def fake_call(cmd, stdout, stderr, env):  # the benchmark command, without running it
        calls.append(cmd)
        return 0 if "ok" in cmd[-1] else 2

    monkeypatch.setattr(parallel_runs.subprocess, "call", fake_call)
    runs = tmp_path / "runs"
    monkeypatch.setattr("sys.argv", ["parallel_runs.py", str(jobs), "--runs", str(runs)])
    assert parallel_runs.main() == 1  # one job failed
    log = (runs / "parallel_runs.log").read_text()
    assert "ok: done" in log and "bad: failed (exit 2)" in log
    # the jobs run in threads, so their call order is not fixed: find each by its --out
    outs = sorted(tuple(c[-2:]) for c in calls)
    assert outs == [("--out", str(runs / "bad")), ("--out", str(runs / "ok"))]
    monkeypatch.setattr("sys.argv", ["parallel_runs.py", str(jobs), "--only", "nope"])
    with pytest.raises(SystemExit, match="nope"):
        parallel_runs.main()


def test_demo_tune_compare_pairs_runs_and_subjects(tmp_path: Path) -> None:
    """``demo_tune.py --compare``: candidates pair on (method, cohort, training seed, cohort
    size) runs and on subjects; the score is the mean of per-run held-out AUCs; the paired CI of a
    difference that holds in every resample excludes 0."""
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
    out = demo_tune.compare(log, ["good", "goodt1"], ["bad", "badt1"], n_boot=200)
    assert out["runs"] == [["nnpu", 100, 1, 48], ["nnpu", 100, 100, 48]]
    assert out["heldout_auc_first"] == 1.0
    assert out["heldout_auc_second"] == pytest.approx((0.0 + 6 / 9) / 2, abs=1e-4)
    assert out["difference"] == pytest.approx(1 - 1 / 3, abs=1e-4)
    assert out["difference_ci95"][0] > 0
    assert out["share_above_0"] == 1.0
    with pytest.raises(SystemExit, match="no run"):
        demo_tune.compare(log, ["good"], ["other"])
    with pytest.raises(SystemExit, match="no run"):
        demo_tune.compare(log, ["big"], ["bad"])
    with pytest.raises(SystemExit, match="no run"):
        demo_tune.compare(log, ["naiveonly"], ["bad"])


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
    runs = []
    for seed in (0, 1):
        run = tmp_path / f"demo-seed{seed}"
        run.mkdir()
        (run / "demo.json").write_text(json.dumps(_demo_record(seed, 60.0 * seed)))
        runs.append(str(run))
    (tmp_path / "demo-seed0.time").write_text("Elapsed (wall clock) time (h:mm:ss or m:ss): 8:30.00\n")
    monkeypatch.setattr("sys.argv", ["demo_seeds.py", "--runs", *runs, "--name", "t",
                                     "--out-dir", str(tmp_path)])
    demo_seeds.main()
    table = (tmp_path / "t.md").read_text()
    record = json.loads((tmp_path / "t.json").read_text())
    assert [s["wall_s"] for s in record["seeds"]] == [510.0, 120.0]  # /usr/bin/time, then total
    assert "Wall time: seed 0 8.5 min, seed 1 2.0 min." in table
    # the AUC table: a row per seed, then the mean (std) of methods and reference lines
    assert ("| mean (std) | | 0.750 (0.000) | 0.750 (0.000) | 1.000 (0.000) | 1.000 (0.000) "
            "| 0.750 (0.000) |") in table
    pairs = {(d["pair"], d["metric"]): d for d in record["paired"]}
    assert list(dict.fromkeys(p for p, _ in pairs)) == [
        "nnpu - naive", "selfpu - nnpu", "nnpu - upu", "selfpu - naive",
        "selfpu - logistic regression on 2 volumes", "nnpu - logistic regression on 2 volumes"]
    # without PU labels in the predictions there is no hidden-positive recall to pair
    assert {m for _, m in pairs} == {"accuracy", "auc"}
    assert pairs[("selfpu - nnpu", "auc")]["value"] == 0.0
    assert pairs[("nnpu - naive", "auc")]["value"] == pytest.approx(0.25)
    assert pairs[("selfpu - logistic regression on 2 volumes", "auc")]["n_subjects"] == 16


def _record(rows_risk: list[tuple[int, str, float]], pools: dict[int, list[str]]):
    """A ValidationRecord whose rules are driven by the given per-row risks."""
    import numpy as np

    rows = [(e, m) for e, m, _ in rows_risk]
    rec = selection_rules.ValidationRecord(rows, np.zeros((len(rows), 4)),
                                           np.array([1, 0, 0, 0], bool), np.arange(4), 0.5, 0.5,
                                           pools, list(pools[max(pools)]))
    return rec, np.array([r for _, _, r in rows_risk])


def test_selection_rules_best_final_and_windows_by_hand() -> None:
    series = [0.5, 0.1, 0.6, 0.25, 0.25, 0.25, 0.25]
    rec, risk = _record([(e, "model", r) for e, r in enumerate(series)],
                        {e: ["model"] for e in range(7)})
    named = selection_rules.rules()
    assert named["best_epoch"](rec, risk) == 1
    assert named["final"](rec, risk) == 6
    # centred means: 0.30, 0.40, 0.3167, 0.3667, 0.25, 0.25, 0.25 (ends: fewer epochs)
    assert named["centered-3"](rec, risk) == 4
    # trailing means: 0.50, 0.30, 0.40, 0.3167, 0.3667, 0.25, 0.25
    assert named["trailing-3"](rec, risk) == 5


def test_selection_rules_only_choose_models_of_the_epochs_pool() -> None:
    # students compete until teachers exist; a student's score after that does not count
    rows = [(0, "student1", 0.05), (1, "student1", 0.0), (1, "teacher1", 0.2),
            (2, "student1", 0.0), (2, "teacher1", 0.1)]
    rec, risk = _record(rows, {0: ["student1"], 1: ["teacher1"], 2: ["teacher1"]})
    assert rec.rows[selection_rules.rule_best_epoch(rec, risk)] == (0, "student1")
    assert rec.rows[selection_rules.rule_final(rec, risk)] == (2, "teacher1")
    assert selection_rules._pool(["student1", "student2", "teacher1", "teacher2"]) == [
        "teacher1", "teacher2"]
    assert selection_rules._pool(["student1", "teacher1", "teacher2", "average"]) == [
        "teacher1", "teacher2"]
    assert selection_rules._pool(["student1", "teacher1", "teacher2", "average"],
                                 "average") == ["average"]
    assert selection_rules._pool(["model"]) == ["model"]


@pytest.mark.parametrize("scheme", ["case-control", "censoring"])
def test_selection_rules_risk_is_the_trainers_pu_risk(scheme: str) -> None:
    import numpy as np
    import torch

    from adni_pu.pu import losses
    from adni_pu.pu.metrics import sigmoid

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 50))
    labelled = rng.random(50) < 0.3
    u_mask = np.ones(50, bool) if scheme == "case-control" else ~labelled
    prior, prior_u = 0.4, (0.4 if scheme == "case-control" else 0.3)
    got = selection_rules.criteria.pu_risks(sigmoid(-logits), sigmoid(logits), labelled, u_mask,
                                             prior, prior_u)
    for row, value in zip(logits, got):
        t = torch.from_numpy(row)
        want = losses.pu_risk(t[torch.from_numpy(labelled)], t[torch.from_numpy(u_mask)],
                              prior, prior_u).unbiased
        assert value == pytest.approx(float(want), abs=1e-12)


def test_selection_rules_study_reads_val_logits_and_scores_held_out(tmp_path: Path) -> None:
    import numpy as np

    from adni_pu.pu.metrics import logit, sigmoid

    seed = tmp_path / "run" / "seed0"
    folder = seed / "val_logits"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    truth = rng.random(400) < 0.5
    labelled = truth & (rng.random(400) < 0.3)
    np.savez(folder / "split.npz", labelled=labelled, unlabelled=np.arange(400),
             prior=np.float64(0.5), prior_u=np.float64(0.5))
    rows = []
    for epoch in range(6):  # students, then teachers from epoch 3
        names = ["student1", "student2"] + (["teacher1", "teacher2"] if epoch >= 3 else [])
        arrays = {n: np.where(truth, 1.0, -1.0) * (1 + epoch) + rng.normal(size=400)
                  for n in names}
        if epoch >= 3:  # as under selection = "final": the average recorded every epoch
            arrays["average"] = logit((sigmoid(arrays["teacher1"])
                                       + sigmoid(arrays["teacher2"])) / 2)
        np.savez(folder / f"epoch-{epoch:04d}.npz", **arrays)
        rows.append({"epoch": epoch, **{f"test_diagnostic/{n}/accuracy": 0.5 + epoch / 100
                                        for n in names}})
    _metrics(seed, rows)
    rec = selection_rules.load_record(seed)
    assert rec.pools[0] == ["student1", "student2"] and rec.pools[5] == ["teacher1", "teacher2"]
    assert rec.finalists == ["teacher1", "teacher2", "average"]
    assert rec.rows.count((5, "average")) == 1
    t1, t2 = (rec.logits[rec.rows.index((5, n))] for n in ("teacher1", "teacher2"))
    np.testing.assert_allclose(sigmoid(rec.logits[rec.rows.index((5, "average"))]),
                               (sigmoid(t1) + sigmoid(t2)) / 2)
    a, b = selection_rules.halvings(rec, 3, seed=0)[0]
    assert not (a & b).any() and (a | b).all()
    assert abs(int((labelled & a).sum()) - int((labelled & b).sum())) <= 1
    assert rec.rows[selection_rules.rule_final_average(rec, np.zeros(len(rec.rows)))] == (5, "average")
    scores = selection_rules.held_out(rec, {"final": selection_rules.rule_final}, 3)
    assert len(scores["final"]) == 6  # both directions of every halving
    result = selection_rules.study([tmp_path / "run"], 3)
    entry = result["seeds"]["run/seed0"]["rules"]["best_epoch"]
    assert entry["full_val_choice"]["epoch"] == 5  # the curves improve every epoch
    assert entry["test_accuracy_diagnostic"] == pytest.approx(0.55)
    assert result["summary"]["best_epoch"]["minus_best_epoch_mean"] == 0.0
    assert "| centered-5 |" in selection_rules.markdown(result)


def test_paper_scale_table_pairs_methods_on_seeds_and_subjects(tmp_path: Path,
                                                                monkeypatch) -> None:
    """``paper_scale.py table``: mean (std) per method over the results files, the reference
    lines, and paired differences of accuracy on the seeds both methods have; a method that
    calls the hidden positives positive beats one that calls them negative."""
    from adni_pu.pu.metrics import bootstrap_ci

    truth = [1, 1, 1, 1, 0, 0, 0, 0]
    pu = [1, 0, 0, 0, 0, 0, 0, 0]
    logits = {"naive": [2.0, -1.0, -1.0, -1.0, -2.0, -2.0, -2.0, -2.0],
              "nnpu": [2.0, 1.0, 1.0, -1.0, -2.0, -2.0, -2.0, 1.0]}
    split = {"subjects": 8, "n_p": 1, "class_prior": 0.5, "hidden_positive": 3,
             "hidden_share": 0.75, "truth_positive": 4}
    results = tmp_path / "results"
    results.mkdir()
    for method, lg in logits.items():
        for seed in ((0, 1) if method == "naive" else (0,)):
            preds = [{"subject_id": f"s{i}", "pu_label": p, "logit": x, "truth": t}
                     for i, (p, x, t) in enumerate(zip(pu, lg, truth))]
            record = {"seed": seed, "wall_s": 60.0, "machine": "test", "data": "toy",
                      "cohort": {"subjects": 8, "cohort_seed": 0,
                                 "splits": {"train": split, "test": split}},
                      "metrics": bootstrap_ci(lg, truth, (*paper_scale.TABLE_METRICS,
                                                          "all_negative_accuracy",
                                                          "all_positive_accuracy"),
                                              n_boot=20, pu_label=pu),
                      "result": {"predictions": preds}}
            (results / f"{method}-seed{seed}.json").write_text(json.dumps(record))
    out = tmp_path / "table.md"
    monkeypatch.setattr("sys.argv", ["paper_scale.py", "table", "--results", str(results),
                                     "--out", str(out), "--boot", "50"])
    paper_scale.main()
    text = out.read_text()
    assert "| naive | 0-1 | 62.5 (0.0) | " in text      # accuracy 5/8 on both seeds
    assert "| nnpu | 0 | 75.0 | " in text and "| 75.96 |" in text   # beside the paper's
    assert "| *reference: call everyone negative* | 0-1 | 50.0 (0.0) |" in text
    # paired on seed 0 only (nnpu has no seed 1): +12.5 accuracy, +66.7 hidden recall
    assert "| nnpu - naive | accuracy | +12.5 [" in text
    assert "| nnpu - naive | hidden positive recall | +66.7 [" in text
    record = json.loads(out.with_suffix(".json").read_text())
    assert [d["seeds"] for d in record["paired"]] == [[0]] * 3
