"""``adni-pu benchmark cohort``: folds, the fixed test set, bad inputs, pooled and paired
scores, resume, the fold ensemble (tiny cohorts)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.workflows.compare.folds import check_folds, fold_frames, subject_table

RUNNER = CliRunner()


def _manifest(n: int = 30, positives: int = 10, seed: int = 0) -> pd.DataFrame:
    """``n`` subjects (every third with two visits), the first ``positives`` labelled."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        truth = 1 if i < positives or rng.random() < 0.3 else 0
        for visit in (("bl", "m12") if i % 3 == 0 else ("bl",)):
            rows.append({"subject_id": f"{100 + i:03d}_S_{i:04d}", "session_id": visit,
                         "scan_path": f"vol/{i}_{visit}.nii", "pu_label": int(i < positives),
                         "truth": float(truth), "split": "train"})
    return pd.DataFrame(rows)


def test_folds_are_disjoint_and_hold_out_every_subject_once():
    frame = _manifest()
    frames, test = fold_frames(frame, 3, 0, set())
    assert test is None
    held = [set(f.loc[f["split"] == "test", "subject_id"]) for f in frames]
    assert set().union(*held) == set(frame["subject_id"])
    assert sum(len(h) for h in held) == frame["subject_id"].nunique()  # no subject twice
    for f, h in zip(frames, held):
        used = set(f.loc[f["split"].isin(["train", "val"]), "subject_id"])
        assert not used & h  # a held-out subject is in neither train nor val
        assert (f.groupby("subject_id")["split"].nunique() == 1).all()  # visits together
        for split in ("train", "val"):
            labels = f[f["split"] == split].groupby("subject_id")["pu_label"].max()
            assert (labels == 1).any() and (labels == 0).any()


def test_fixed_test_set_chooses_nothing():
    frame = _manifest(40, 12)
    subjects = subject_table(frame)
    test = set(subjects["subject_id"][::8])
    frames, test_frame = fold_frames(frame, 3, 0, test)
    assert set(test_frame["subject_id"]) == test and (test_frame["split"] == "test").all()
    for f in frames:
        assert not set(f["subject_id"]) & test  # in no fold's train, val or held-out part
    # the test subjects' labels and truth change nothing about the folds
    flipped = frame.copy()
    mask = flipped["subject_id"].isin(test)
    flipped.loc[mask, "truth"] = 1 - flipped.loc[mask, "truth"]
    flipped.loc[mask, "pu_label"] = 1 - flipped.loc[mask, "pu_label"]
    again, _ = fold_frames(flipped, 3, 0, test)
    for a, b in zip(frames, again):
        pd.testing.assert_frame_equal(a, b)


def test_too_few_positives_names_the_largest_k():
    from adni_pu.errors import ConfigError
    from adni_pu.workflows.compare.folds import MAX_FOLDS, workable_folds

    subjects = subject_table(_manifest(30, 3))  # 2 folds: one holds out 2 of the 3 positives
    with pytest.raises(ConfigError, match=r"2 folds of 30 subjects cannot all train") as err:
        check_folds(subjects, 2, 0, "m.csv")
    k = int(str(err.value).rsplit("is ", 1)[1])
    check_folds(subjects, k, 0, "m.csv")  # the K it names works, and no larger one does
    assert all(workable_folds(subjects, j, 0) for j in range(k + 1, MAX_FOLDS + 1))


@pytest.mark.parametrize(("change", "args", "expected"), [
    ("nolabels", [], "pu_label"),
    ("", ["--methods", "naive,magic"], "unknown method 'magic'"),
    ("", ["--folds", "1"], "--folds 1: expected at least 2"),
    ("", ["--seeds", "0"], "--seeds 0: expected at least 1"),
    ("", ["--piece", "99"], "--piece '99'"),
    ("", ["--piece", "3/2"], "shard '3/2'"),
    ("notruth", [], "fold 0: no training subject has a known truth"),
    ("", ["--prior", "estimate"], "estimating the class prior needs at least 10"),
    ("", ["--keep-test"], "--keep-test expected rows with split 'test'"),
])
def test_bad_input_is_one_line_before_any_work(tmp_path, change, args, expected):
    frame = _manifest()
    if change == "nolabels":
        frame["pu_label"] = 0
    if change == "notruth":
        frame["truth"] = np.nan
    path = tmp_path / "manifest.csv"
    frame.to_csv(path, index=False)
    out = tmp_path / "out"
    result = RUNNER.invoke(app, ["benchmark", "cohort", str(path), str(out), *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], result.output
    assert not (out / "pieces").exists()


def _frame(logits: list[float], truth: list[int], seed: int = 0) -> pd.DataFrame:
    n = len(logits)
    return pd.DataFrame({"seed": seed, "subject_id": [f"s{i}" for i in range(n)],
                         "logit": logits, "probability": 1 / (1 + np.exp(-np.array(logits))),
                         "truth": np.array(truth, float), "pu_label": [1, 0] * (n // 2)})


def test_pooled_metrics_and_paired_ci_against_a_hand_computation():
    from adni_pu.workflows.compare.scores import method_scores, paired_scores

    truth = [1, 1, 0, 0, 1, 0]
    a = pd.concat([_frame([2, -1, -3, 1, 4, -2], truth, 0), _frame([1, 1, -1, -1, 1, -1],
                                                                   truth, 1)])
    scored = method_scores(a, n_boot=200)
    acc = scored["metrics"]["accuracy"]
    assert acc["value"] == pytest.approx((4 / 6 + 6 / 6) / 2)  # mean over seeds
    assert acc["over_seeds"]["mean"] == pytest.approx(5 / 6)
    assert acc["over_seeds"]["std"] == pytest.approx(np.std([4 / 6, 1.0], ddof=1))
    # the CI by hand: the same draws (seeds, then subjects within each drawn seed)
    rng = np.random.default_rng(0)
    right = [np.array([1, 0, 1, 0, 1, 1.0]), np.ones(6)]
    draws = []
    for _ in range(200):
        seeds = rng.integers(0, 2, 2)
        draws.append(np.mean([right[g][rng.integers(0, 6, 6)].mean() for g in seeds]))
    assert acc["ci_low"] == pytest.approx(np.percentile(draws, 2.5))
    assert acc["ci_high"] == pytest.approx(np.percentile(draws, 97.5))
    # a method right everywhere against one wrong everywhere: +1 in every resample
    good = _frame([1, 1, -1, -1, 1, -1], truth)
    bad = _frame([-1, -1, 1, 1, -1, 1], truth)
    pair = paired_scores({"good": good, "bad": bad}, [("good", "bad")], 100)[0]
    acc = pair["metrics"]["accuracy"]
    assert (acc["value"], acc["ci_low"], acc["ci_high"]) == (1.0, 1.0, 1.0)
    assert acc["share_a_better"] == 1.0
    # the PU task's own difference: subject 1, the one hidden positive, found or missed
    assert pair["metrics"]["hidden_positive_recall"]["value"] == 1.0


def test_calibration_error_by_hand():
    from adni_pu.workflows.compare.scores import calibration

    cal = calibration(np.array([0.05, 0.05, 0.95, 0.95, 0.55]), np.array([0, 1, 1, 1, np.nan]))
    # bins: 0 holds 0.05 twice (positive fraction 1/2), 9 holds 0.95 twice (fraction 1)
    assert cal["n"] == 4
    assert cal["ece"] == pytest.approx(0.5 * 0.45 + 0.5 * 0.05)


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """A 2-fold x 1-seed comparison of naive and nnPU at 1 epoch on the tiny cohort."""
    from volume_helpers import make_volume_cohort, tiny_overrides

    root = tmp_path_factory.mktemp("compare")
    manifest = make_volume_cohort(root / "cohort")
    sets = [a for o in tiny_overrides(1, root / "cache") for a in ("--set", o)]
    args = ["benchmark", "cohort", str(manifest), str(root / "out"), "--methods",
            "naive,nnpu", "--folds", "2", "--seeds", "1", "--bootstrap", "50", *sets]
    result = RUNNER.invoke(app, args)
    assert result.exit_code == 0, result.output
    return root, manifest, args, result.output


def test_comparison_end_to_end(compared):
    root, manifest, args, output = compared
    out = root / "out"
    assert "pieces: 4 trained" in output
    report = json.loads((out / "report.json").read_text())
    assert set(report["methods"]) == {"naive", "nnpu"}
    assert [p["pair"] for p in report["paired"]] == ["nnpu - naive"]
    assert {(p["method"], p["fold"]) for p in report["priors"]} == {
        (m, k) for m in ("naive", "nnpu") for k in (0, 1)}
    text = (out / "report.md").read_text()
    for part in ("Pooled held-out metrics", "Paired differences", "all-negative",
                 "logistic regression on 2 volumes", "Class prior per fold", "ECE"):
        assert part in text
    assert (out / "roc.png").stat().st_size and (out / "calibration.png").stat().st_size
    # every held-out subject once, scored by the fold that held it out
    for k in (0, 1):
        fold = pd.read_csv(out / "folds" / f"fold-{k}" / "manifest.csv", dtype=str)
        piece = json.loads((out / "pieces/naive" / f"fold-{k}/seed-0/piece.json").read_text())
        held = {p["subject_id"] for p in piece["held_out"]}
        assert held == set(fold.loc[fold["split"] == "test", "subject_id"])
    # the records are the table tool's
    table = RUNNER.invoke(app, ["benchmark", "table", str(out / "records")])
    assert table.exit_code == 0, table.output
    assert "nnpu - naive" in table.output
    # rerunning skips every finished piece; other settings into the folder are refused
    again = RUNNER.invoke(app, args)
    assert again.exit_code == 0 and "0 trained, 4 finished before" in again.output
    other = RUNNER.invoke(app, [*args, "--fold-seed", "3"])
    assert other.exit_code == 2 and "other settings" in other.output


def test_cut_short_piece_resumes_to_the_same_result(compared):
    root, _, args, _ = compared
    where = root / "out/pieces/nnpu/fold-1/seed-0"
    before = json.loads((where / "piece.json").read_text())
    (where / "piece.json").unlink()  # cut short after its checkpoint, before its results
    result = RUNNER.invoke(app, [*args, "--piece", "4/4"])
    assert result.exit_code == 0, result.output
    assert "1 trained" in result.output
    after = json.loads((where / "piece.json").read_text())
    assert after["held_out"] == before["held_out"]
    assert after["selected_epoch"] == before["selected_epoch"]


def test_fold_models_predict_together(compared, tmp_path):
    from adni_pu.workflows.compare.ensemble import ensemble_predict
    from adni_pu.workflows.predict import predict_scans

    root, manifest, _, _ = compared
    out = root / "out"
    scans = [manifest.parent / "vol/sub-14_ses-bl_desc-preproc_T1w.nii",
             manifest.parent / "vol/sub-3_ses-bl_desc-preproc_T1w.nii"]
    table = ensemble_predict(out, scans, "nnpu", device="cpu")
    single = [predict_scans(out / f"pieces/nnpu/fold-{k}/seed-0", scans, device="cpu")
              for k in (0, 1)]
    probs = np.stack([t["probability"].to_numpy() for t in single])
    np.testing.assert_allclose(table["probability"], probs.mean(axis=0))
    np.testing.assert_allclose(table["spread_std"], probs.std(axis=0, ddof=1))
    assert (table["n_models"] == 2).all()
    result = RUNNER.invoke(app, ["predict", str(out), *map(str, scans), "--method", "nnpu",
                                 "--device", "cpu"])
    assert result.exit_code == 0 and "over 2 fold models" in result.output
    # evaluate on a comparison folder: the piece's run folder
    ev = RUNNER.invoke(app, ["evaluate", str(out), "--method", "naive", "--fold", "0",
                             "--bootstrap", "0", "--device", "cpu"])
    assert ev.exit_code == 0, ev.output
    assert (out / "pieces/naive/fold-0/seed-0/evaluation/test/metrics.json").is_file()
    bad = RUNNER.invoke(app, ["evaluate", str(out), "--method", "naive", "--fold", "5"])
    assert bad.exit_code == 2 and "--fold 5: expected 0 to 1" in bad.output


def test_fixed_test_set_is_scored_apart(tmp_path):
    from volume_helpers import make_volume_cohort, tiny_overrides

    manifest = make_volume_cohort(tmp_path / "cohort")
    sets = [a for o in tiny_overrides(1, tmp_path / "cache") for a in ("--set", o)]
    out = tmp_path / "out"
    result = RUNNER.invoke(app, ["benchmark", "cohort", str(manifest), str(out), "--methods",
                                 "naive", "--folds", "2", "--test-size", "3",
                                 "--bootstrap", "20", *sets])
    assert result.exit_code == 0, result.output
    test = set(pd.read_csv(out / "folds/independent_test.csv", dtype=str)["subject_id"])
    assert len(test) == 3
    for k in (0, 1):
        run = out / f"pieces/naive/fold-{k}/seed-0"
        seen = pd.read_csv(run / "splits.csv", dtype=str)
        assert not set(seen["subject_id"]) & test  # never trained, validated or held out
        piece = json.loads((run / "piece.json").read_text())
        assert {p["subject_id"] for p in piece["independent_test"]} == test
    report = json.loads((out / "report.json").read_text())
    assert report["independent_test"]["naive"]["fold_models"] == 2
    assert "Fixed test set" in (out / "report.md").read_text()


def test_a_piece_held_by_another_process_is_left_to_it(compared):
    import threading

    from adni_pu.locking import output_lock

    root, _, args, _ = compared
    where = root / "out/pieces/naive/fold-0/seed-0"
    (where / "piece.json").unlink()
    held, release = threading.Event(), threading.Event()

    def other() -> None:  # another process's lock on that piece (a thread: its own lock)
        with output_lock(where, "benchmark cohort"):
            held.set()
            release.wait(60)

    thread = threading.Thread(target=other)
    thread.start()
    held.wait(10)
    try:
        result = RUNNER.invoke(app, args)
    finally:
        release.set()
        thread.join()
    assert result.exit_code == 0, result.output
    assert "0 trained" in result.output and "1 held by another process" in result.output
    report = json.loads((root / "out/report.json").read_text())
    assert report["unfinished_pieces"] == ["naive/fold-0/seed-0"]
    again = RUNNER.invoke(app, args)
    assert "1 trained" in again.output
    assert not json.loads((root / "out/report.json").read_text())["unfinished_pieces"]


def _cohort_tables(tmp_path, n: int = 40) -> tuple:
    """An ADNIMERGE-like clinical table (two visits per subject, the later one's age 0-3
    years on) and a preprocessing summary with its listed volumes."""
    clinical = ["RID,PTID,VISCODE,EXAMDATE,DX_bl,DX,AGE,PTGENDER,AV45,FBB,PIB"]
    scans = ["subject_id,session_id,input_path,status,preprocessed_path,error,seconds"]
    for i in range(1, n + 1):
        dx_bl, dx = [("CN", "CN"), ("LMCI", "MCI"), ("AD", "Dementia"), ("CN", "CN")][i % 4]
        av45 = f"{0.95 + 0.007 * i:.3f}" if i % 5 else ""
        sex = "Male" if i % 3 else "Female"
        for visit, date, older in (("bl", "2010", 0), ("m12", "2011", i % 4)):
            clinical.append(f"{i},011_S_{i:04d},{visit},{date}-01-{i % 27 + 1:02d},{dx_bl},{dx},"
                            f"{60 + (7 * i) % 23 + older},{sex},{av45 if visit == 'bl' else ''},,")
        for ses in ("M000", "M012"):
            volume = f"sub-ADNI011S{i:04d}/ses-{ses}/t1.nii.gz"
            scans.append(f"ADNI011S{i:04d},{ses},/raw/{i}_{ses}.nii,done,{volume},,3")
            (tmp_path / volume).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / volume).write_text(volume)
    (tmp_path / "ADNIMERGE.csv").write_text("\n".join(clinical) + "\n")
    (tmp_path / "summary.csv").write_text("\n".join(scans) + "\n")
    return tmp_path / "ADNIMERGE.csv", tmp_path / "summary.csv"


def test_holdout_split_is_the_cohort_builders(tmp_path):
    """Seed s's hold-out holds out the subjects `cohort build` holds out with split seed s
    (what the paper-scale testbed's per-seed cohorts held out), from any manifest of the
    cohort; held-out subjects neither train nor validate."""
    from adni_pu.cohort import build_cohort, load_cohort_config
    from adni_pu.workflows.compare.folds import (
        holdout_assignment,
        holdout_frame,
        holdout_subjects,
    )

    clinical, summary = _cohort_tables(tmp_path)

    def built(seed: int) -> pd.DataFrame:
        cfg = load_cohort_config(values={"split": {"seed": seed, "test_fraction": 8 / 40,
                                                   "val_fraction": 0.2}})
        return build_cohort(clinical, summary, cfg).manifest

    given = built(0)  # the manifest the comparison is given, split with another seed
    subjects = holdout_subjects(given)
    assert len(subjects) == 40
    for seed in (1, 2, 7):
        want = built(seed).groupby("subject_id")["split"].first().astype(str).to_dict()
        got = holdout_assignment(subjects, 8, 0.2, seed)
        assert got == want
        assert sum(v == "test" for v in got.values()) == 8
        frame = holdout_frame(given, got)
        per_subject = frame.groupby("subject_id")["split"].nunique()
        assert (per_subject == 1).all()  # a subject's visits stay together
        test = set(frame.loc[frame["split"] == "test", "subject_id"])
        assert not test & set(frame.loc[frame["split"] != "test", "subject_id"])
    assert holdout_assignment(subjects, 8, 0.2, 1) != holdout_assignment(subjects, 8, 0.2, 2)


@pytest.mark.parametrize(("args", "expected"), [
    (["--holdout", "4", "--folds", "3"], "--holdout 4 and --folds 3: choose one"),
    (["--holdout", "4", "--test-size", "3"], "--holdout: a split per seed"),
    (["--holdout", "4", "--keep-test"], "--holdout: a split per seed"),
    (["--val-fraction", "0.2"], "--val-fraction: only with --holdout"),
    (["--holdout", "30"], "--holdout 30: expected 1 to 29"),
    (["--holdout", "4", "--val-fraction", "0.9"], "--val-fraction 0.9: expected above 0"),
    (["--methods", "naive,nnpu-estimated", "--set", "prior=0.3"], "nnpu-estimated fixes"),
    (["--methods", "naive,nnpu-estimated"], "estimating the class prior needs at least 10"),
])
def test_bad_holdout_combinations_are_one_line(tmp_path, args, expected):
    path = tmp_path / "manifest.csv"
    _manifest().to_csv(path, index=False)
    out = tmp_path / "out"
    result = RUNNER.invoke(app, ["benchmark", "cohort", str(path), str(out), *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], result.output
    assert not out.exists() or not any(out.iterdir())


def test_a_variant_trains_its_preset_with_its_own_prior():
    from adni_pu.workflows.compare.pieces import CompareSpec, Piece, piece_config

    spec = CompareSpec(manifest="m.csv", out="o", methods=("nnpu", "nnpu-estimated"),
                       prior=0.4)
    own = piece_config(spec, Piece("nnpu-estimated", 0, 3))
    given = piece_config(spec, Piece("nnpu", 0, 3))
    assert own.prior == "estimate" and given.prior == 0.4
    assert (own.preset, own.train.method, own.train.seed) == ("nnpu", "nnpu", 3)
    assert own.train.method == given.train.method


def test_holdout_comparison_end_to_end(tmp_path):
    from volume_helpers import make_volume_cohort, tiny_overrides

    manifest = make_volume_cohort(tmp_path / "cohort")
    sets = [a for o in tiny_overrides(1, tmp_path / "cache") for a in ("--set", o)]
    out = tmp_path / "out"
    args = ["benchmark", "cohort", str(manifest), str(out), "--methods", "naive",
            "--holdout", "4", "--val-fraction", "0.3", "--seeds", "2", "--first-seed", "5",
            "--bootstrap", "20", *sets]
    result = RUNNER.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "pieces: 2 trained" in result.output
    held = {}
    for seed in (5, 6):
        split = pd.read_csv(out / f"folds/seed-{seed}/manifest.csv", dtype=str)
        test = set(split.loc[split["split"] == "test", "subject_id"])
        run = out / f"pieces/naive/fold-0/seed-{seed}"
        seen = pd.read_csv(run / "splits.csv", dtype=str)
        assert not set(seen.loc[seen["split"] != "test", "subject_id"]) & test
        piece = json.loads((run / "piece.json").read_text())
        held[seed] = {p["subject_id"] for p in piece["held_out"]}
        assert held[seed] == test and len(test) == 4
        assert piece["splits"]["test"]["subjects"] == 4
    assert held[5] != held[6]  # each seed its own split
    settings = json.loads((out / "comparison.json").read_text())["settings"]
    assert (settings["holdout"], settings["folds"]) == (4, 1)
    assert "repeated hold-out" in (out / "report.md").read_text()
    record = json.loads((out / "records/naive.json").read_text())
    assert [r["seed"] for r in record["per_seed"]] == [5, 6]
    # evaluate / interpret name a hold-out piece by its method and seed (its one fold)
    from adni_pu.workflows.compare.ensemble import resolve_run

    assert resolve_run(out, "naive", None, 6) == out / "pieces/naive/fold-0/seed-6"


def test_pairs_sharing_one_bootstrap_equal_each_pair_alone():
    """paired_scores draws once for every pair over the same seeds; each pair's numbers
    must equal its own paired_difference, whatever the row order of the frames."""
    import numpy as np
    import pandas as pd

    from adni_pu.workflows.compare.scores import PAIRED_METRICS, paired_difference, paired_scores

    rng = np.random.default_rng(1)
    rows = []
    for seed in range(3):
        truth = rng.integers(0, 2, 30).astype(float)
        truth[:3] = np.nan
        rows.append(pd.DataFrame({
            "seed": seed, "subject_id": [f"s{i}" for i in rng.permutation(30)],
            "truth": truth, "pu_label": ((truth == 1) & (rng.random(30) < 0.4)).astype(int),
            "x": rng.normal(size=30) + truth, "y": rng.normal(size=30),
            "z": rng.normal(size=30) + 0.5 * truth}))
    table = pd.concat(rows)
    frames = {m: table.rename(columns={m: "logit"})[
        ["seed", "subject_id", "truth", "pu_label", "logit"]].sample(frac=1, random_state=k)
        for k, m in enumerate("xyz")}
    shared = paired_scores(frames, [("x", "y"), ("z", "y"), ("x", "z")], 200)
    for d in shared:
        for metric in PAIRED_METRICS:
            alone = paired_difference(frames[d["a"]], frames[d["b"]], n_boot=200,
                                      metric=metric)
            assert d["metrics"][metric] == alone, (d["pair"], metric)
