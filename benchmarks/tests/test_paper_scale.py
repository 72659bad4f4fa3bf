"""``benchmarks/paper_scale.py``: the generator's truth line on each seed's hold-out split of
a comparison, and the table beside the paper's from a comparison folder (tiny synthetic
inputs; the comparison itself: tests/test_compare.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from adni_pu.workflows.compare.pieces import CompareSpec, Piece, piece_dir, prepare
from adni_pu.workflows.compare.report import write_report
from benchmarks import paper_scale

TRUTH = [1, 1, 1, 1, 0, 0, 0, 0]
PU = [1, 0, 0, 0, 0, 0, 0, 0]
SPLIT = {"subjects": 8, "n_p": 1, "class_prior": 0.5, "hidden_positive": 3,
         "hidden_share": 0.75, "truth_positive": 4}


def _main(monkeypatch, *argv: object) -> None:
    monkeypatch.setattr("sys.argv", ["paper_scale.py", *map(str, argv)])
    paper_scale.main()


def test_best_threshold_maximises_accuracy_on_the_given_subjects() -> None:
    scores = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert paper_scale.best_threshold(scores, [0, 0, 0, 1, 1, 1]) == pytest.approx(0.35)
    # one error either way: the lowest best cut; unknown truth is left out
    cut = paper_scale.best_threshold([*scores, 0.05], [0, 1, 0, 1, 1, 1, np.nan])
    assert cut == pytest.approx(0.15)
    assert paper_scale.best_threshold([0.2, 0.1], [1, 1]) < 0.1  # everyone positive


def test_truth_line_scores_each_seeds_held_out_subjects(tmp_path: Path, monkeypatch) -> None:
    """``truth OUT --synth DIR``: per seed of a ``--holdout`` comparison, the generator's
    hippocampal loss cut at the best threshold on that seed's training subjects, scored on
    its held-out subjects (those the seed's pieces hold out)."""
    rng = np.random.default_rng(0)
    n = 30
    ids = [f"{100 + i:03d}_S_{i:04d}" for i in range(n)]
    truth = [1.0 if i < 10 or rng.random() < 0.3 else 0.0 for i in range(n)]
    manifest = pd.DataFrame({"subject_id": ids, "session_id": "bl",
                             "scan_path": [f"vol/{i}.nii" for i in range(n)],
                             "pu_label": [int(i < 8) for i in range(n)], "truth": truth,
                             "split": "train"})
    manifest.to_csv(tmp_path / "manifest.csv", index=False)
    synth = tmp_path / "synth"
    synth.mkdir()
    loss = pd.Series(rng.normal(size=n) + np.asarray(truth), index=ids)
    pd.DataFrame({"subject_id": ids, "hippocampal_loss": loss.to_numpy()}).to_csv(
        synth / "truth_scans.csv", index=False)
    out = tmp_path / "out"
    spec = CompareSpec(manifest=str(tmp_path / "manifest.csv"), out=str(out),
                       methods=("naive",), folds=1, seeds=2, first_seed=3, holdout=6)
    prepare(spec)  # the seed manifests, as the comparison writes them (no training)
    _main(monkeypatch, "truth", out, "--synth", synth)
    for seed in (3, 4):
        split = pd.read_csv(out / f"folds/seed-{seed}/manifest.csv", dtype={"subject_id": str})
        test = split[split["split"] == "test"]
        train = split[split["split"] == "train"]
        line = json.loads((out / f"references/seed-{seed}.json").read_text())["lines"][
            paper_scale.TRUTH]
        preds = pd.DataFrame(line["predictions"])
        assert sorted(preds["subject_id"]) == sorted(test["subject_id"]) and len(preds) == 6
        cut = line["threshold"]["hippocampal_loss"]
        assert cut == paper_scale.best_threshold(loss[train["subject_id"]].to_numpy(),
                                                 train["truth"].to_numpy())
        np.testing.assert_allclose(preds["logit"], loss[preds["subject_id"]].to_numpy() - cut)
    # a K-fold comparison has no split per seed for the truth line to follow
    kfold = tmp_path / "kfold"
    prepare(CompareSpec(manifest=str(tmp_path / "manifest.csv"), out=str(kfold),
                        methods=("naive",), folds=2))
    with pytest.raises(SystemExit, match="a comparison with --holdout"):
        _main(monkeypatch, "truth", kfold, "--synth", synth)


def _piece(out: Path, method: str, seed: int, logits: list[float], **extra) -> None:
    """A finished piece of ``method`` on seed ``seed``: 8 held-out subjects (4 positive, one
    of them labelled)."""
    held = [{"subject_id": f"s{i}", "pu_label": p, "truth": float(t), "logit": x}
            for i, (p, x, t) in enumerate(zip(PU, logits, TRUTH))]
    record = {"method": method, "fold": 0, "seed": seed,
              "prior": {"prior": 0.5, "source": "cohort"}, "prior_estimate": None,
              "selected_epoch": 1, "selected_model": "model", "epochs": 1,
              "train_seconds": 60.0, "machine": "test",
              "splits": {"train": SPLIT, "val": SPLIT, "test": SPLIT}, "held_out": held,
              "independent_test": None, **extra}
    where = piece_dir(out, Piece(method, 0, seed))
    where.mkdir(parents=True)
    (where / "piece.json").write_text(json.dumps(record))


def _comparison(out: Path, methods: tuple[str, ...], seeds: int) -> None:
    out.mkdir(parents=True)
    spec = CompareSpec(manifest="m.csv", out=str(out), methods=methods, folds=1, seeds=seeds,
                       holdout=8)
    (out / "comparison.json").write_text(json.dumps(
        {"manifest": "m.csv", "manifest_sha256": None, "settings": spec.recorded()}))


def test_table_shows_methods_reference_lines_pairs_and_the_estimated_prior(
        tmp_path: Path, monkeypatch) -> None:
    """``table OUT``: mean (std) over seeds per method from the pieces, the all-negative and
    all-positive lines, the reference lines of ``references/``, the paired differences of
    ``report.json`` (cohort-report's) and the prior estimates against the true priors."""
    out = tmp_path / "paper-scale"
    _comparison(out, ("naive", "nnpu", "nnpu-estimated"), 2)
    naive = [2.0, -1.0, -1.0, -1.0, -2.0, -2.0, -2.0, -2.0]     # accuracy 5/8
    nnpu = [2.0, 1.0, 1.0, -1.0, -2.0, -2.0, -2.0, 1.0]         # accuracy 6/8
    estimated = [2.0, 1.0, 1.0, 1.0, -2.0, -2.0, 1.0, 1.0]      # 6/8, every hidden positive
    for seed, (value, low, high) in enumerate(((0.50, 0.40, 0.60), (0.30, 0.25, 0.35))):
        _piece(out, "naive", seed, naive)
        _piece(out, "nnpu", seed, nnpu)
        _piece(out, "nnpu-estimated", seed, estimated, prior_estimate={
            "value": value, "ci_low": low, "ci_high": high, "method": "bbe",
            "true_prior": 0.46, "classifier": {"val_pu_auc": 0.7}})
    for seed, logits in ((0, [1, 1, 1, 1, -1, -1, -1, -1]),     # accuracy 1
                         (1, [1, 1, 1, -1, -1, -1, -1, 1])):    # accuracy 0.75
        preds = [{"subject_id": f"s{i}", "pu_label": p, "logit": x, "truth": t}
                 for i, (p, x, t) in enumerate(zip(PU, logits, TRUTH))]
        (out / "references").mkdir(exist_ok=True)
        (out / "references" / f"seed-{seed}.json").write_text(json.dumps(
            {"seed": seed, "wall_s": 30.0, "machine": "test",
             "lines": {name: {"predictions": preds}
                       for name in (paper_scale.LOGISTIC, paper_scale.TRUTH)}}))
    table = tmp_path / "table.md"
    with pytest.raises(SystemExit, match="no report.json"):
        _main(monkeypatch, "table", out, "--out", table)
    write_report(out, [("nnpu", "naive"), ("nnpu-estimated", "nnpu")], n_boot=50)
    _main(monkeypatch, "table", out, "--out", table)
    text = table.read_text()
    assert "| naive | 0-1 | 62.5 (0.0) | " in text
    assert "| nnpu | 0-1 | 75.0 (0.0) | " in text and "| 75.96 | 1 | test |" in text
    assert "| nnpu-estimated | 0-1 | 75.0 (0.0) | 81.2 (0.0) |" in text  # AUC 13/16
    assert " | - | 1 | test |" in text   # no paper accuracy for the new method
    assert "| *reference: call everyone negative* | 0-1 | 50.0 (0.0) |" in text
    for name in (paper_scale.LOGISTIC, paper_scale.TRUTH):
        assert f"| *reference: {name}* | 0-1 | 87.5 (17.7) | " in text
    assert "| nnpu - naive | accuracy | +12.5 [" in text
    assert "| nnpu - naive | hidden positive recall | +66.7 [" in text
    assert "| nnpu-estimated - nnpu | hidden positive recall | +33.3 [" in text
    assert "| 0 | 0.460 | 0.500 [0.400, 0.600] | +0.040 | yes | 0.700 |" in text
    assert "| 1 | 0.460 | 0.300 [0.250, 0.350] | -0.160 | no | 0.700 |" in text
    assert "Mean absolute error 0.100 over 2 seed(s) (mean error -0.060); the CI held " \
           "the true prior on 1 of 2." in text
    record = json.loads(table.with_suffix(".json").read_text())
    assert record["prior_estimation"]["ci_holds_true_prior"] == 1
    assert record["references"][paper_scale.TRUTH]["accuracy"]["mean"] == pytest.approx(0.875)
    assert record["methods"]["nnpu-estimated"]["seeds"] == [0, 1]


def test_table_beside_another_cohort_pairs_each_method_with_itself(tmp_path: Path,
                                                                   monkeypatch) -> None:
    """``table --beside``: each method against itself in another comparison of the same
    subjects (preprocessed scans against ideal volumes), on the seeds and held-out subjects
    both have; a subject scored on one side only is left out and counted."""
    real, ideal = tmp_path / "real", tmp_path / "ideal"
    _comparison(ideal, ("naive", "nnpu"), 2)
    _comparison(real, ("nnpu",), 1)
    calls_all_positive = [2.0, 1.0, 1.0, 1.0, -2.0, -2.0, -2.0, -2.0]   # accuracy 8/8
    misses_two = [2.0, 1.0, -1.0, -1.0, -2.0, -2.0, -2.0, -2.0]        # accuracy 6/8
    for seed in (0, 1):
        _piece(ideal, "nnpu", seed, calls_all_positive)
        _piece(ideal, "naive", seed, misses_two)
    _piece(real, "nnpu", 0, misses_two)    # no seed 1 here
    # a subject the real side did not score (a scan that failed preprocessing), and one
    # without a truth (no PET), paired but left out of every metric
    path = piece_dir(real, Piece("nnpu", 0, 0)) / "piece.json"
    record = json.loads(path.read_text())
    record["held_out"] = record["held_out"][:-1]
    record["held_out"][6]["truth"] = None
    path.write_text(json.dumps(record))
    write_report(real, n_boot=20)
    table = tmp_path / "table.md"
    _main(monkeypatch, "table", real, "--out", table, "--beside", ideal)
    text = table.read_text()
    # the 6 common subjects with a truth: 4/6 against 6/6; hidden recall 1/3 against 3/3
    assert "| nnpu: real - ideal | accuracy | -33.3 [" in text
    assert "| nnpu: real - ideal | hidden positive recall | -66.7 [" in text
    # seed 0 only; the 7 subjects both scored, 6 of them with a truth
    assert "| 0 | 7 of 7 / 8 (6 with a truth) |" in text
    assert "naive:" not in text        # no naive run on the real side
    beside = json.loads(table.with_suffix(".json").read_text())["beside"]
    assert [d["pair"] for d in beside["paired"]] == ["nnpu: real - ideal"]
    assert beside["results"] == str(ideal)
    _comparison(tmp_path / "empty", ("nnpu",), 1)
    with pytest.raises(SystemExit, match="no method has a finished seed"):
        _main(monkeypatch, "table", real, "--out", table, "--beside", tmp_path / "empty")


def test_seed_lists_and_machine_cells_are_compact_and_unambiguous():
    assert paper_scale.seed_list([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8"
    assert paper_scale.seed_list([3]) == "3"
    cpu, gpu = "2-core CPU VM, no GPU; torch threads 1", "H100; 8 pieces at a time"
    recs = [{"seed": s, "machine": cpu} for s in (0, 1, 2, 9)]
    assert paper_scale.machine_cell(recs) == cpu
    recs += [{"seed": s, "machine": gpu} for s in range(3, 9)]
    assert paper_scale.machine_cell(recs) == f"{cpu} (seeds 0-2, 9) / {gpu} (seeds 3-8)"
