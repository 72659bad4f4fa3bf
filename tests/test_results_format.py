"""The benchmark's results files (adni_pu.workflows.results_format): one owner of the fields
that ``adni-pu benchmark`` writes and the results table reads."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from adni_pu.workflows import results_format as fmt


def _seed_record(seed: int, accuracy: float) -> dict:
    record = {key: None for key in fmt.SEED_FIELDS}
    record.update(seed=seed, config={"epochs": 2, "batch_size": 8, "lr": 1e-3,
                                     "weight_decay": 0.0, "model": "mlp6", "method": "nnpu",
                                     "val_criterion": "pu_risk", "pn_validation": False,
                                     "selection": "best_epoch", "selfpu": {}},
                  data={"prior": 0.49}, selected_epoch=1, selected_model="model",
                  test={"accuracy": accuracy, "balanced_accuracy": accuracy, "auc": 0.9,
                        "f1": 0.8}, test_accuracy_test_selected=accuracy + 0.01,
                  seconds_per_epoch={"phase1": 1.5},
                  test_examples=fmt.test_examples([1.0, -1.0, 2.0], [1, 0, 0]))
    return record


def _spec(tmp_path: Path) -> SimpleNamespace:
    return SimpleNamespace(dataset="mnist", data_dir=tmp_path, label="nnpu", n_labelled=100,
                           scheme="case-control", val_fraction=0.1, train_limit=None,
                           test_limit=None)


def test_a_seed_record_round_trips_with_exactly_its_fields(tmp_path):
    record = _seed_record(3, 0.9)
    path = fmt.write_seed_result(tmp_path, 3, dict(reversed(list(record.items()))))
    assert path == tmp_path / "seed3" / "result.json"
    assert list(json.loads(path.read_text())) == list(fmt.SEED_FIELDS)  # written in order
    assert fmt.read_seed_result(tmp_path, 3) == record
    assert fmt.read_seed_result(tmp_path, 4) is None
    with pytest.raises(ValueError, match="differ"):
        fmt.write_seed_result(tmp_path, 5, {**record, "extra": 1})


def test_the_results_file_names_every_machine_its_seeds_trained_on(tmp_path):
    seeds = [_seed_record(0, 0.90), _seed_record(1, 0.92), _seed_record(2, 0.91)]
    seeds[0]["machines"] = ["1x H200", "2-core CPU"]  # resumed on the CPU
    seeds[1]["machines"] = ["2-core CPU"]  # seeds[2]: a record from before pieces
    assert fmt.results_machine(seeds, "here") == "1x H200 + 2-core CPU + here"
    summary = fmt.aggregate(_spec(tmp_path), seeds[:2], "adni-pu benchmark mnist")
    assert summary["machine"] == "1x H200 + 2-core CPU"
    assert summary["per_seed"][0]["machines"] == ["1x H200", "2-core CPU"]


def test_a_damaged_seed_record_is_one_line_naming_the_file(tmp_path):
    path = fmt.seed_result_path(tmp_path, 0)
    path.parent.mkdir()
    path.write_text('{"seed": 0, "conf')
    with pytest.raises(fmt.ResultsError, match=r"seed0/result.json: not JSON"):
        fmt.read_seed_result(tmp_path, 0)
    path.write_text("[1, 2]")
    with pytest.raises(fmt.ResultsError, match=r"result.json: expected a JSON object.*list"):
        fmt.read_seed_result(tmp_path, 0)


def test_the_results_file_written_is_the_results_file_read(tmp_path):
    seeds = [_seed_record(0, 0.90), _seed_record(1, 0.92)]
    summary = fmt.aggregate(_spec(tmp_path), seeds, "adni-pu benchmark mnist")
    assert [list(r) for r in summary["per_seed"]] == [list(fmt.PER_SEED_FIELDS)] * 2
    assert summary["results"]["nnpu"]["test_accuracy"]["mean"] == pytest.approx(91.0)
    also = tmp_path / "copy.json"
    path = fmt.write_results(tmp_path / "out", summary, also)
    assert path == tmp_path / "out" / fmt.RESULTS_FILE and also.read_text() == path.read_text()
    assert "| nnpu | 91.00 (1.41) |" in (tmp_path / "out" / fmt.RESULTS_TABLE).read_text()
    read = fmt.read_results_file(also)
    assert read["settings"]["method"] == "nnpu" and len(read["per_seed"]) == 2
    assert fmt.schedule(read["settings"]) == {"epochs": 2, "warmup_epochs": None,
                                              "self_paced_end": None}
    assert fmt.data_settings(read["settings"])["n_labelled"] == 100
    examples = read["per_seed"][0]["test_examples"]
    assert fmt.unpack_bits(examples["correct"], examples["n"]).tolist() == [True, True, False]


@pytest.mark.parametrize("content, message", [
    ("not json", "not JSON"),
    (json.dumps({"settings": {"method": "nnpu"}, "results": {}}), "field 'per_seed' missing"),
    (json.dumps({"settings": {"method": "x"}, "results": {"nnpu": {}}, "per_seed": []}),
     "settings.method is 'x' but results holds"),
])
def test_a_file_that_is_not_a_results_file_is_refused(tmp_path, content, message):
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(fmt.ResultsError, match=f"r.json: {message}"):
        fmt.read_results_file(path)
