"""A demo run's fingerprint (:mod:`adni_pu.workflows.demo_fingerprint`): held-out logits per
method, and the differences between two runs beyond the tolerance."""

from __future__ import annotations

import json

from adni_pu.workflows.demo_fingerprint import LOGIT_ATOL, METRICS, differences, fingerprint


def test_fingerprint_sees_a_moved_logit_and_a_changed_subject_set() -> None:
    record = {"results": {"nnpu": {
        "predictions": [{"subject_id": "b", "logit": 0.5}, {"subject_id": "a", "logit": -1.0}],
        "pooled": {"metrics": {m: {"value": 0.5} for m in METRICS}}}}}
    base = fingerprint(record)
    assert list(base["nnpu"]["logits"]) == ["a", "b"]
    assert base["nnpu"]["metrics"] == dict.fromkeys(METRICS, 0.5)
    same = json.loads(json.dumps(base))
    same["nnpu"]["logits"]["a"] += LOGIT_ATOL / 2
    assert differences(base, same) == []
    moved = json.loads(json.dumps(base))
    moved["nnpu"]["logits"]["b"] += 0.01
    assert differences(base, moved) == [
        "nnpu: 1/2 logits moved by more than 0.001 (largest +0.0100, subject b)"]
    fewer = json.loads(json.dumps(base))
    del fewer["nnpu"]["logits"]["a"]
    assert differences(base, fewer) == ["nnpu: scored subjects differ (2 recorded, 1 now)"]
    assert differences(base, {}) == ["methods: expected ['nnpu'], found []"]
