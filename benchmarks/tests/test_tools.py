"""The benchmark tools: the parallel job runner's job files and packing and the demo-seeds
table (the paper-scale table: test_paper_scale.py)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from benchmarks import demo_seeds, parallel_runs


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
    times = {"train+evaluate naive": 30.0, "train+evaluate nnpu": 50.0,
             "compare (report)": 2.0 + seed, "total": 60.0 + shift}
    return {"settings": {"seed": seed}, "times_s": times,
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
    # the comparison's own time beyond its pieces (80 s of training and scoring)
    assert "pieces' time: seed 0 2.0 s (2.5 %), seed 1 3.0 s (3.8 %); what" in table
    assert [s["overhead_share"] for s in record["seeds"]] == [0.025, 0.0375]
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
