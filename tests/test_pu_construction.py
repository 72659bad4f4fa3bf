"""PU construction: counts, priors, schemes, validation/test disjointness, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adni_pu.data.pu import PUConstructionError, binarize, make_pu_data, unlabelled_prior


def make(n=1000, n_labelled=100, seed=0, **kw):
    rng = np.random.default_rng(42)
    y = (rng.random(n) < 0.45).astype(int)
    x = torch.arange(n, dtype=torch.float32).unsqueeze(1)  # each example carries its id
    xt = -torch.arange(1, 201, dtype=torch.float32).unsqueeze(1)
    yt = (rng.random(200) < 0.45).astype(int)
    return make_pu_data(x, y, xt, yt, n_labelled=n_labelled, seed=seed, **kw), y


def test_counts_and_disjoint_splits():
    pu, y = make(val_fraction=0.1)
    assert len(pu.val) == 100 and len(pu.train) == 900 and len(pu.test) == 200
    assert pu.train.labelled.sum() + pu.val.labelled.sum() == 100
    ids_train = set(pu.train.x[:, 0].int().tolist())
    ids_val = set(pu.val.x[:, 0].int().tolist())
    assert not ids_train & ids_val
    assert len(ids_train | ids_val) == 1000
    assert not pu.test.labelled.any()
    # labelled examples are true positives; truth is carried through
    assert (pu.train.truth[pu.train.labelled] == 1).all()
    ids = pu.train.x[:, 0].long().numpy()
    np.testing.assert_array_equal(pu.train.truth, y[ids])


def test_prior_from_data_and_given():
    pu, y = make(prior=None)
    assert pu.prior == pytest.approx(y.mean())
    pu2, _ = make(prior=0.3)
    assert pu2.prior == 0.3


def test_case_control_and_censoring_unlabelled_sets():
    pu, _ = make(scheme="case-control")
    assert len(pu.train.unlabelled_indices("case-control")) == len(pu.train)
    pu_c, _ = make(scheme="censoring", prior=0.45)
    u = pu_c.train.unlabelled_indices("censoring")
    assert len(u) == len(pu_c.train) - pu_c.train.labelled.sum()
    assert not pu_c.train.labelled[u].any()
    assert pu_c.prior_u < pu_c.prior


def test_unlabelled_prior_formula():
    assert unlabelled_prior(0.5, 1000, 100, "censoring") == pytest.approx(400 / 900)
    assert unlabelled_prior(0.5, 1000, 100, "case-control") == 0.5


def test_same_seed_same_split_other_seed_differs():
    a, _ = make(seed=3)
    b, _ = make(seed=3)
    c, _ = make(seed=4)
    np.testing.assert_array_equal(a.train.labelled, b.train.labelled)
    assert not np.array_equal(a.train.x, c.train.x)


def test_binarize():
    np.testing.assert_array_equal(binarize(np.array([0, 1, 2, 9, 8]), (0, 2, 4, 6, 8)),
                                  [1, 0, 1, 0, 1])


@pytest.mark.parametrize("kwargs, message", [
    ({"n_labelled": 10_000}, "n_labelled=10000: expected between 1 and the"),
    ({"n_labelled": 0}, "n_labelled=0"),
    ({"prior": 1.0}, r"class prior 1.0: expected a number strictly in \(0, 1\)"),
    ({"prior": -0.2}, "class prior -0.2"),
    ({"val_fraction": 0.0}, "val_fraction=0.0"),
    ({"n_labelled": 1, "val_fraction": 0.5}, "gets no labelled positive"),
    ({"scheme": "other"}, "scheme 'other'"),
])
def test_impossible_requests_are_refused(kwargs, message):
    with pytest.raises(PUConstructionError, match=message):
        make(**kwargs)


def test_empty_test_split_refused():
    x = torch.zeros(10, 1)
    with pytest.raises(PUConstructionError, match="test split is empty"):
        make_pu_data(x, np.ones(10, int), x[:0], np.zeros(0, int), n_labelled=5)
