"""The results table (adni_pu.workflows.results_table, run as ``adni-pu benchmark table`` and
as benchmarks/mnist_table.py) on hand-made results files: means, std, paired differences,
the schedule check and its one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.workflows.results_format import ResultsError

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "mnist_table.py"


@pytest.fixture(scope="module")
def table():
    from adni_pu.workflows import results_table

    return results_table


def _table(*args: str) -> int:
    """``adni-pu benchmark table ARGS``; its exit status."""
    return CliRunner().invoke(app, ["benchmark", "table", *args]).exit_code


def _write(folder: Path, method: str, seeds: dict[int, float], epochs: int = 20,
           selfpu: dict | None = None, share: float | None = None, name: str | None = None,
           examples: dict[int, dict] | None = None, machine: str | None = None,
           estimates: dict[int, dict] | None = None) -> Path:
    """A results file as `adni-pu benchmark ... --results-json` writes it (the fields read)."""
    per_seed = [{"seed": s, "test": {"accuracy": acc, "auc": acc + 0.05},
                 "test_accuracy_test_selected": acc + 0.01,
                 "seconds_per_epoch": {"phase1": 2.0 + s}, "nn_correction_share": share,
                 "test_examples": (examples or {}).get(s),
                 "prior_estimate": (estimates or {}).get(s)}
                for s, acc in seeds.items()]
    data = {"settings": {"method": method, "epochs": epochs, "selfpu": selfpu},
            "results": {method: {}}, "per_seed": per_seed}
    if machine is not None:
        data["machine"] = machine
    path = folder / f"{name or method}.json"
    path.write_text(json.dumps(data))
    return path


SP = {"warmup_epochs": 5, "self_paced_end": 10}


def test_means_std_and_paired_differences(table, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    _write(runs, "naive", {0: 0.50, 1: 0.52, 2: 0.54})
    _write(runs, "nnpu", {0: 0.90, 1: 0.91}, share=0.25, name="nnpu-s01", machine="gpu A")
    _write(runs, "nnpu", {2: 0.95}, share=0.5, name="nnpu-s2", machine="cpu B")
    _write(runs, "selfpu", {0: 0.92, 1: 0.90}, selfpu=SP)
    assert _table(str(runs), "--pair", "selfpu,naive") == 0
    record = json.loads((tmp_path / "runs-table.json").read_text())
    nnpu = record["rows"]["nnpu"]
    assert nnpu["n_seeds"] == 3 and nnpu["seeds"] == [0, 1, 2]
    assert nnpu["test_accuracy"]["mean"] == pytest.approx(92.0)
    assert nnpu["test_accuracy"]["std"] == pytest.approx(2.6457513, rel=1e-6)  # sd of 90, 91, 95
    assert nnpu["test_accuracy_test_selected"]["mean"] == pytest.approx(93.0)
    assert nnpu["test_auc"]["mean"] == pytest.approx(97.0)
    assert nnpu["seconds_per_epoch"]["phase1"]["mean"] == pytest.approx(3.0)
    assert nnpu["nn_correction_share"]["mean"] == pytest.approx(1 / 3)
    assert record["rows"]["naive"]["nn_correction_share"] is None
    # the machines that made each row's files are named (a row may mix them)
    assert nnpu["machines"] == ["gpu A", "cpu B"]
    assert record["rows"]["naive"]["machines"] == ["not recorded"]
    text = (tmp_path / "runs-table.md").read_text()
    assert "| gpu A; cpu B |" in text
    # a row of one seed has no standard deviation to show
    assert "| selfpu | 2 |" in text and "(one seed)" not in text
    _write(runs, "upu", {0: 0.88})
    assert _table(str(runs)) == 0
    assert "| upu | 1 | 20 | 88.00 (one seed) |" in (tmp_path / "runs-table.md").read_text()
    pairs = {d["pair"]: d for d in record["paired"]}
    assert list(pairs) == ["selfpu - nnpu", "nnpu - naive", "selfpu - naive"]
    d = pairs["selfpu - nnpu"]  # seeds 0 and 1 only: differences +2 and -1
    assert d["seeds"] == [0, 1] and d["value"] == pytest.approx(0.5)
    half = 12.7062047 * 1.5  # t(0.975, 1) * sd / sqrt(2), sd of (2, -1) = 3 / sqrt(2)
    assert d["ci_high"] - d["value"] == pytest.approx(half, rel=1e-6)
    assert pairs["nnpu - naive"]["value"] == pytest.approx(40.0)  # 40, 39, 41
    text = (tmp_path / "runs-table.md").read_text()
    assert "| nnpu | 3 | 20 | 92.00 (2.65) | 93.00 (2.65) | 97.00 (2.65) | phase1: 3.0 | " \
           "0.333 (0.144) |" in text
    assert "| selfpu - nnpu | +0.50 [" in text and "t-interval over seeds" in text


def test_ablation_states_and_checks_the_schedule(table, tmp_path):
    runs = tmp_path / "abl"
    runs.mkdir()
    _write(runs, "nnpu", {0: 0.9, 1: 0.9})
    _write(runs, "selfpu", {0: 0.9, 1: 0.92}, selfpu=SP)
    _write(runs, "selfpu-no-reweight", {0: 0.91, 1: 0.93}, selfpu=SP)
    text, record = table.build(runs, [], ablation=True)
    assert record["schedule_check"]["same"]
    assert "| selfpu-no-reweight | 2 | 20 | 5 | 10 | 92.00 (1.41) |" in text
    assert "| nnpu | 2 | 20 | - | - |" in text
    _write(runs, "selfpu-short", {0: 0.9}, selfpu={"warmup_epochs": 5, "self_paced_end": 8})
    with pytest.raises(ResultsError, match=r"selfpu-short\.json: self_paced_end = 8 but "
                       r"10 in 'selfpu'"):
        table.build(runs, [], ablation=True)
    assert _table(str(runs), "--ablation") == 2
    assert not (tmp_path / "abl-table.md").exists()  # refused: nothing written
    text, record = table.build(runs, [], ablation=True, allow_mixed=True)
    assert record["schedule_check"]["differing"] == ["selfpu-short"]
    assert "| selfpu-short (schedule differs) |" in text
    _write(runs, "nnpu", {0: 0.9}, epochs=30, name="nnpu-30")  # another schedule, same label
    with pytest.raises(ResultsError, match=r"nnpu.json: schedule .* of 'nnpu' differs"):
        table.build(runs, [], ablation=True, allow_mixed=True)


def test_bad_files_are_one_line_errors(table, tmp_path):
    runs = tmp_path / "bad"
    runs.mkdir()
    with pytest.raises(ResultsError, match="no \\*.json results files"):
        table.build(runs, [])
    _write(runs, "nnpu", {0: 0.9}, name="a")
    _write(runs, "nnpu", {0: 0.91}, name="b")
    with pytest.raises(ResultsError, match=r"b.json: seed 0 of 'nnpu' is also in .*a.json"):
        table.build(runs, [])
    (runs / "b.json").write_text(json.dumps({"settings": {"method": "x"}, "results": {}}))
    with pytest.raises(ResultsError, match="b.json: field 'per_seed' missing"):
        table.build(runs, [])
    _write(runs, "naive", {0: 0.5}, name="b")
    data = json.loads((runs / "b.json").read_text())
    data["settings"]["n_labelled"] = 100
    (runs / "b.json").write_text(json.dumps(data))
    with pytest.raises(ResultsError, match=r"a.json: data settings .* differ from .*'naive'"):
        table.build(runs, [("nnpu", "naive")])
    (runs / "b.json").unlink()
    with pytest.raises(ResultsError, match="--pair nnpu,upu: no results for 'upu'"):
        table.build(runs, [("nnpu", "upu")])


def test_per_example_results_give_a_paired_bootstrap_over_seeds_and_examples(table, tmp_path):
    from adni_pu.workflows.results_format import test_examples, unpack_bits

    rng = np.random.default_rng(0)
    truth = {s: rng.integers(0, 2, 400).astype(float) for s in (0, 1)}
    logits = {m: {} for m in ("nnpu", "selfpu")}
    for s in (0, 1):  # nnpu right on 80 % of the examples, selfpu on those and 5 % more
        right = np.arange(400) < 320 + 40 * s
        sign = np.where(truth[s] == 1, 1.0, -1.0)
        logits["nnpu"][s] = np.where(right, sign, -sign)
        logits["selfpu"][s] = np.where(right | (np.arange(400) >= 380), sign, -sign)
    record = test_examples(logits["nnpu"][0], truth[0])
    assert record["n"] == 400 and unpack_bits(record["truth"], 400).tolist() == (
        truth[0] == 1).tolist()
    assert unpack_bits(record["correct"], 400).sum() == 320
    runs = tmp_path / "pb"
    runs.mkdir()
    for m in ("nnpu", "selfpu"):
        acc = {s: float(((logits[m][s] > 0) == (truth[s] == 1)).mean()) for s in (0, 1)}
        _write(runs, m, acc, examples={s: test_examples(logits[m][s], truth[s]) for s in (0, 1)})
    text, record = table.build(runs, [])
    (d,) = record["paired"]
    assert d["value"] == pytest.approx(100 * (20 / 400 + 20 / 400) / 2)  # 5.0 points
    assert d["interval"].startswith("paired bootstrap over seeds and test examples")
    assert d["n_examples"] == 800 and d["ci_low"] < 5.0 < d["ci_high"] and d["ci_low"] > 2.0
    assert d["share_a_better"] == 1.0
    assert "| selfpu - nnpu | +5.00 [" in text and "paired bootstrap" in text
    other = rng.integers(0, 2, 400).astype(float)  # nnpu's seed 1 on other examples
    _write(runs, "nnpu", {0: 0.8, 1: 0.9}, examples={
        0: test_examples(logits["nnpu"][0], truth[0]), 1: test_examples(logits["nnpu"][1], other)})
    with pytest.raises(ResultsError, match="seed 1: 'selfpu' and 'nnpu' .* different test"):
        table.build(runs, [])


def test_labels_from_file_names_and_the_final_rule(table, tmp_path):
    runs = tmp_path / "fix"
    runs.mkdir()
    # two Self-PU variants that differ by a --set only: one label each from the file names
    _write(runs, "selfpu", {0: 0.90}, selfpu=SP, name="selfpu-s0")
    _write(runs, "selfpu", {0: 0.80}, selfpu=SP, name="selfpu-band-s0")
    with pytest.raises(ResultsError, match="seed 0 of 'selfpu' is also in"):
        table.build(runs, [])
    with pytest.raises(ResultsError, match="test_accuracy_final_rule_diagnostic"):
        table.build(runs, [], label_from_name=True, final_rule=("selfpu",))
    for name, final in (("selfpu-s0", 0.95), ("selfpu-band-s0", 0.70)):
        data = json.loads((runs / f"{name}.json").read_text())
        data["per_seed"][0]["test_accuracy_final_rule_diagnostic"] = final
        data["per_seed"][0]["test_examples"] = {"n": 1, "truth": "AA==", "correct": "AA=="}
        (runs / f"{name}.json").write_text(json.dumps(data))
    text, record = table.build(runs, [("selfpu-band", "selfpu")], label_from_name=True,
                               final_rule=("selfpu",))
    assert set(record["rows"]) == {"selfpu", "selfpu-band"}
    assert record["rows"]["selfpu"]["test_accuracy"]["mean"] == pytest.approx(95.0)
    assert record["rows"]["selfpu"]["rule"] == "final"
    assert record["rows"]["selfpu-band"]["test_accuracy"]["mean"] == pytest.approx(80.0)
    assert "| selfpu (final rule) |" in text
    (pair,) = record["paired"]
    # the final rule's model has no per-example results: a t-interval, not the bootstrap
    assert pair["value"] == pytest.approx(-15.0) and pair["interval"].startswith("t-interval")
    with pytest.raises(ResultsError, match="--final-rule nope"):
        table.build(runs, [], label_from_name=True, final_rule=("nope",))


def test_final_rule_rows_drop_the_other_models_auc_and_keep_runs_made_final(table, tmp_path):
    runs = tmp_path / "fin"
    runs.mkdir()
    path = _write(runs, "selfpu", {0: 0.90}, selfpu=SP, name="selfpu-s0")
    data = json.loads(path.read_text())
    data["per_seed"][0]["test_accuracy_final_rule_diagnostic"] = 0.95
    path.write_text(json.dumps(data))
    _, record = table.build(runs, [], label_from_name=True, final_rule=("selfpu",))
    row = record["rows"]["selfpu"]
    assert row["test_accuracy"]["mean"] == pytest.approx(95.0)
    assert row["test_auc"]["n"] == 0  # the AUC was the best-epoch model's: not reported
    # a run made under selection = "final" already reports the final model: kept as it is
    data["settings"]["selection"] = "final"
    data["per_seed"][0]["test_examples"] = {"n": 1, "truth": "AA==", "correct": "AA=="}
    path.write_text(json.dumps(data))
    entries = table.load_results(runs, label_from_name=True)
    table.use_final_rule(entries["selfpu"], "selfpu")
    kept = entries["selfpu"]["seeds"][0]
    assert kept["test"]["accuracy"] == 0.90 and kept["test_examples"]
    assert entries["selfpu"]["rule"] == "final"


def test_protocol_applies_the_final_rule_to_every_selfpu_row(table, tmp_path):
    runs = tmp_path / "proto"
    runs.mkdir()
    for name, method, selfpu_settings in (("nnpu-s0", "nnpu", None), ("sp-s0", "sp", SP)):
        path = _write(runs, method, {0: 0.90}, selfpu=selfpu_settings, name=name)
        data = json.loads(path.read_text())
        data["per_seed"][0]["test_accuracy_final_rule_diagnostic"] = 0.80
        path.write_text(json.dumps(data))
    _, record = table.build(runs, [], label_from_name=True, protocol=True)
    assert record["rows"]["sp"]["rule"] == "final"
    assert record["rows"]["sp"]["test_accuracy"]["mean"] == pytest.approx(80.0)
    assert record["rows"]["nnpu"]["rule"] != "final"
    assert record["rows"]["nnpu"]["test_accuracy"]["mean"] == pytest.approx(90.0)
    with pytest.raises(ResultsError, match="choose one"):
        table.build(runs, [], label_from_name=True, protocol=True, final_rule=("sp",))


def test_the_recorded_script_path_still_makes_the_table(tmp_path):
    """Results files record `python benchmarks/mnist_table.py ...`: that path runs the
    package's table."""
    runs = tmp_path / "runs"
    runs.mkdir()
    _write(runs, "naive", {0: 0.50, 1: 0.52})
    done = subprocess.run([sys.executable, str(SCRIPT), str(runs)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert "| naive | 2 |" in (tmp_path / "runs-table.md").read_text()
    missing = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "none")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "none: folder not found" in missing.stderr


def test_the_table_command_records_itself_and_refuses_a_bad_pair(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    _write(runs, "naive", {0: 0.50, 1: 0.52})
    _write(runs, "nnpu", {0: 0.90, 1: 0.91})
    stem = tmp_path / "out" / "t"
    stem.parent.mkdir()
    result = CliRunner().invoke(app, ["benchmark", "table", str(runs), "--out", str(stem),
                                      "--pair", "naive,nnpu", "--label-from-name"])
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "out" / "t.json").read_text())
    assert record["command"] == (f"adni-pu benchmark table {runs} --out {stem} "
                                 "--pair naive,nnpu --label-from-name")
    assert [d["pair"] for d in record["paired"]] == ["nnpu - naive", "naive - nnpu"]
    assert f"From `{record['command']}`." in (tmp_path / "out" / "t.md").read_text()
    assert "| nnpu | 2 |" in result.output and "provenance" in record
    bad = CliRunner().invoke(app, ["benchmark", "table", str(runs), "--pair", "naive"])
    assert bad.exit_code == 2 and "'naive': expected A,B (two labels)" in bad.output


def test_with_reads_another_folders_files_as_rows_of_the_same_table(tmp_path):
    base, later = tmp_path / "base", tmp_path / "later"
    base.mkdir()
    later.mkdir()
    _write(base, "nnpu", {0: 0.90, 1: 0.92}, name="nnpu-s01")
    _write(later, "vpu", {0: 0.80, 1: 0.86}, name="vpu-s01")
    result = CliRunner().invoke(app, ["benchmark", "table", str(later), "--with", str(base),
                                      "--pair", "vpu,nnpu"])
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "later-table.json").read_text())
    assert list(record["rows"]) == ["nnpu", "vpu"]
    assert record["rows"]["nnpu"]["files"] == [str(base / "nnpu-s01.json")]
    (diff,) = record["paired"]
    assert diff["pair"] == "vpu - nnpu" and diff["value"] == pytest.approx(-8.0)
    assert f"--with {base} --pair vpu,nnpu" in record["command"]
    # a seed in both folders is refused, as within one folder; an empty folder too
    _write(later, "nnpu", {1: 0.93}, name="nnpu-s1")
    clash = CliRunner().invoke(app, ["benchmark", "table", str(later), "--with", str(base)])
    assert clash.exit_code != 0 and "seed 1 of 'nnpu'" in clash.output
    (tmp_path / "empty").mkdir()
    empty = CliRunner().invoke(app, ["benchmark", "table", str(base), "--with",
                                     str(tmp_path / "empty")])
    assert empty.exit_code != 0 and "empty: no *.json results files" in empty.output


def test_rows_with_an_estimated_prior_show_the_estimate_beside_the_truth(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    _write(runs, "nnpu", {0: 0.90, 1: 0.92})
    est = {s: {"value": v, "ci_low": lo, "ci_high": hi, "method": "bbe", "true_prior": 0.5}
           for s, v, lo, hi in ((0, 0.44, 0.40, 0.48), (1, 0.52, 0.47, 0.56),
                                (2, 0.50, 0.45, 0.55))}
    est[2]["true_prior"] = None  # a seed without a true prior: in the mean, not in the error
    _write(runs, "nnpu", {0: 0.89, 1: 0.91, 2: 0.90}, name="nnpu-est", estimates=est)
    assert _table(str(runs), "--label-from-name") == 0
    record = json.loads((tmp_path / "runs-table.json").read_text())
    assert record["rows"]["nnpu"]["prior_estimate"] is None
    summary = record["rows"]["nnpu-est"]["prior_estimate"]
    assert summary["value"]["mean"] == pytest.approx(1.46 / 3)
    assert summary["abs_error"]["mean"] == pytest.approx(0.04) and summary["abs_error"]["n"] == 2
    assert summary["ci_coverage"] == {"covered": 1, "n": 2}
    text = (tmp_path / "runs-table.md").read_text()
    assert "| nnpu-est | 3 | bbe | 0.487 (0.042) | 0.500 | 0.040 (0.028) | 1 of 2 |" in text
    assert "| nnpu | 2 | bbe" not in text
