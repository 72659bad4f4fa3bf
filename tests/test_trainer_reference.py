"""metrics.csv keeps its meaning: the trainer's per-epoch statistics equal recorded values.

The reference file was recorded with the trainer as it was before the sync-free rewrite
(every statistic read with ``.item()`` per batch), at commit 658f582:

    PYTHONPATH=<checkout of 658f582> python tests/test_trainer_reference.py --record

A change that alters what a column means (or the batches, or the loss terms) fails here.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

REFERENCE = Path(__file__).parent / "data" / "trainer_reference.json"
# Columns added after the recording that read the hidden labels only (nothing trains on
# them), so they cannot change what the recorded columns mean.
ADDED_DIAGNOSTICS = ("/prior_rest_truth",)
SP = {"warmup_epochs": 1, "self_paced_end": 2, "select_every": 1, "teacher_rampup_epochs": 1}
CASES = {
    "naive": {"method": "naive", "epochs": 1},
    "upu": {"method": "upu", "epochs": 1},
    "nnpu": {"method": "nnpu", "epochs": 2},
    "selfpu": {"method": "selfpu", "epochs": 4, "selfpu": SP},
    "published-code": {"method": "selfpu", "epochs": 4,
                       "selfpu": {**SP, "labels": "entropy", "student_consistency": "per_batch",
                                  "teacher_average": "uniform", "meta_sign_flip": True}},
    "hard-censoring": {"method": "selfpu", "epochs": 3,
                       "selfpu": {**SP, "labels": "hard", "rates": [0.3],
                                  "student_consistency": "none", "teachers": False}},
}


def _history(name: str) -> list[dict]:
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import blobs, tiny_config

    from adni_pu.data.pu import make_pu_data
    from adni_pu.pu.trainer import Trainer

    torch.set_num_threads(1)
    x, y = blobs(600, 0)
    xt, yt = blobs(200, 1)
    scheme = "censoring" if "censoring" in name else "case-control"
    data = make_pu_data(x, y, xt, yt, n_labelled=60, prior=0.4, val_fraction=0.2, seed=0,
                        scheme=scheme, name="blobs")
    cfg = tiny_config(**CASES[name], batch_size=64, track_test=True)
    history = Trainer(cfg, data).fit().history
    return [{k: v for k, v in row.items()
             if not k.startswith("time/") and not k.endswith(ADDED_DIAGNOSTICS)}
            for row in history]


@pytest.mark.parametrize("name", sorted(CASES))
def test_metrics_equal_recorded_values(name):
    import torch

    reference = json.loads(REFERENCE.read_text())
    recorded_on = reference.get("_cpu_capability")
    if recorded_on != torch.backends.cpu.get_cpu_capability():
        # other SIMD kernels sum in another order: equal only to rounding, which a few epochs
        # of trusted-set ranking can turn into different counts; not a change of meaning
        pytest.skip(f"reference recorded on a {recorded_on} CPU")
    expected = reference[name]
    got = _history(name)
    assert len(got) == len(expected)
    for epoch, (row, ref) in enumerate(zip(got, expected)):
        assert sorted(row) == sorted(ref), f"epoch {epoch}: columns differ"
        for key, value in ref.items():
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(row[key]), f"epoch {epoch} {key}"
            elif isinstance(value, float):
                assert row[key] == pytest.approx(value, rel=1e-5, abs=1e-7), f"epoch {epoch} {key}"
            else:
                assert row[key] == value, f"epoch {epoch} {key}"


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    import torch

    recorded = {n: _history(n) for n in CASES}
    recorded["_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    REFERENCE.write_text(json.dumps(recorded, indent=1) + "\n")
    print(f"wrote {REFERENCE}")
