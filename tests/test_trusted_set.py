"""Self-paced trusted set: sizes per epoch, balance, in-and-out, soft targets."""

from __future__ import annotations

import numpy as np
import pytest

from adni_pu.pu.trusted_set import select_trusted_set, target_size


def test_linear_schedule_sizes_every_10_epochs():
    sizes = [target_size(e, 1000, 0.2, 10, 50, 10) for e in (10, 20, 30, 40)]
    assert sizes == [50, 100, 150, 200]


def test_linear_schedule_every_epoch_grows_to_full_size():
    sizes = [target_size(e, 1000, 0.3, 10, 50, 1) for e in range(10, 50)]
    assert sizes[0] < 10 and sizes[-1] == 300
    assert all(b >= a for a, b in zip(sizes, sizes[1:]))


def test_fixed_schedule_and_even_sizes():
    assert target_size(10, 1000, 0.2, 10, 50, 10, "fixed") == 200
    assert target_size(12, 333, 0.3, 10, 50, 10, "fixed") % 2 == 0
    assert target_size(10, 3, 0.2, 10, 50, 10) == 0  # guard: nothing to select


def test_balanced_selection_of_extremes_with_soft_targets():
    scores = np.linspace(0.0, 1.0, 101)
    candidates = np.arange(1, 101)  # index 0 is a labelled positive, not a candidate
    ts = select_trusted_set(scores, candidates, 10, labels="soft")
    pos = ts.indices[ts.pseudo_labels == 1]
    neg = ts.indices[ts.pseudo_labels == 0]
    assert len(pos) == len(neg) == 5
    assert sorted(pos.tolist()) == [96, 97, 98, 99, 100]
    assert sorted(neg.tolist()) == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(ts.targets, scores[ts.indices].astype(np.float32))
    hard = select_trusted_set(scores, candidates, 10, labels="hard")
    np.testing.assert_array_equal(hard.targets, hard.pseudo_labels.astype(np.float32))


def test_size_zero_and_oversized_requests():
    scores = np.random.default_rng(0).random(20)
    assert len(select_trusted_set(scores, np.arange(20), 0)) == 0
    ts = select_trusted_set(scores, np.arange(7), 100)
    assert len(ts) == 6 and len(set(ts.indices.tolist())) == 6


def test_in_and_out_rebuilds_from_scratch():
    scores = np.linspace(0, 1, 50)
    first = select_trusted_set(scores, np.arange(50), 4)
    assert 49 in first.indices
    scores2 = scores.copy()
    scores2[49] = 0.5  # no longer confident
    second = select_trusted_set(scores2, np.arange(50), 4, previous=first, replacement=True)
    assert 49 not in second.indices and len(second) == 4


def test_without_replacement_keeps_members():
    scores = np.linspace(0, 1, 50)
    first = select_trusted_set(scores, np.arange(50), 4, labels="soft")
    scores2 = scores.copy()
    scores2[49] = 0.5
    second = select_trusted_set(scores2, np.arange(50), 8, previous=first, replacement=False)
    assert set(first.indices) <= set(second.indices)
    assert len(second) == 8
    # a kept member keeps the target stored when it was selected
    kept = np.flatnonzero(second.indices == 49)[0]
    assert second.targets[kept] == pytest.approx(1.0)


def test_label_accuracy_against_truth():
    scores = np.array([0.1, 0.2, 0.8, 0.9])
    truth = np.array([0, 1, 1, 1])
    ts = select_trusted_set(scores, np.arange(4), 4)
    assert ts.label_accuracy(truth) == pytest.approx(0.75)
