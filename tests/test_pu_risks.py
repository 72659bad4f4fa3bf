"""The PU risk settings, hand-computed (adni_pu.pu.losses, calibration, trusted_set,
batching): the band risk on D_U minus the trusted set (``rest_risk="band"``), the
mean-one self-calibration (``reweight_risk="mean-one"``), labelled-positive
oversampling (``positive_share``), and the risk that selection re-applies to recorded
logits (``criteria.pu_risks``) equal to the trainer's."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import tiny_config

from adni_pu.pu import calibration, criteria, losses, objective
from adni_pu.pu.batching import EpochPlan
from adni_pu.pu.config import SelfPUConfig
from adni_pu.pu.metrics import sigmoid
from adni_pu.pu.trainer import Trainer
from adni_pu.pu.trusted_set import (
    band_positives,
    band_prior,
    score_band,
    select_trusted_set,
)

LN3 = math.log(3.0)


# ------------------------------------------------------------------ the band risk


def test_pu_risk_with_its_own_correction_term_positives():
    # l(0, +-1) = 0.5; l(ln 3, -1) = sigmoid(ln 3) = 0.75; c = (1 - 0.4) / (1 - 0.2) = 0.75
    p, u, p_neg = torch.zeros(2), torch.zeros(4), torch.tensor([LN3])
    risk = losses.pu_risk(p, u, 0.4, 0.2, logits_p_neg=p_neg)
    assert float(risk.positive) == pytest.approx(0.4 * 0.5)  # all labelled positives
    assert float(risk.negative) == pytest.approx(0.75 * (0.5 - 0.2 * 0.75))
    default = losses.pu_risk(p, u, 0.4, 0.2)
    assert float(default.negative) == pytest.approx(0.75 * (0.5 - 0.2 * 0.5))
    # no labelled positive in the band: the correction term is zero
    empty = losses.pu_risk(p, u, 0.4, 0.2, logits_p_neg=torch.zeros(0))
    assert float(empty.negative) == pytest.approx(0.75 * 0.5)


def _band_example():
    """6 labelled positives (0-5) and 10 unlabelled (6-15) with given scores."""
    scores = np.array([0.99, 0.9, 0.85, 0.5, 0.1, 0.05,  # labelled positives
                       0.95, 0.9, 0.8, 0.6, 0.5, 0.45, 0.3, 0.2, 0.1, 0.05])
    labelled = np.arange(16) < 6
    trusted = select_trusted_set(scores, np.arange(6, 16), 4, "hard")
    return scores, labelled, trusted


def test_band_from_the_trusted_sets_boundary_scores():
    scores, labelled, trusted = _band_example()
    # top 2 unlabelled (0.95, 0.9) pseudo-positive, bottom 2 (0.1, 0.05) pseudo-negative
    assert sorted(trusted.indices[trusted.pseudo_labels == 1]) == [6, 7]
    assert sorted(trusted.indices[trusted.pseudo_labels == 0]) == [14, 15]
    assert score_band(scores, trusted) == (0.1, 0.9)
    # strictly inside (0.1, 0.9): 0.85 and 0.5; the boundary scores 0.9 and 0.1 are out
    inside = band_positives(scores, labelled, trusted)
    assert inside.tolist() == [2, 3]
    f_band = len(inside) / 6
    # pi_rest = pi_u n_u f_band / |U'| = 0.4 * 10 * (1/3) / 6
    assert band_prior(0.4, 10, len(trusted), f_band) == pytest.approx(4 / 18)
    assert band_prior(0.4, 10, 4, 0.0) == 1e-3  # clipped like the prior correction


def test_band_layout_and_prior_in_the_trainer(tiny_pu):
    cfg = tiny_config(method="selfpu", selfpu={"warmup_epochs": 0, "rest_risk": "band",
                                               "reweight": False})
    trainer = Trainer(cfg, tiny_pu)
    trainer.strategy.select(0)
    st = trainer.state.students[0]
    scores = 1 / (1 + np.exp(-trainer.predict_logits(st.model, tiny_pu.train)))
    expected = band_positives(scores, tiny_pu.train.labelled, st.trusted)
    assert np.array_equal(st.band_pos, expected) and 0 < len(expected) < trainer.run.n_p
    # default: pi_rest counted from the pseudo-labels, with U' leaving out the labelled
    # positives' copies that case-control D_U holds (all n_p of them here)
    assert tiny_pu.scheme == "case-control" and trainer.run.n_copies == trainer.run.n_p
    n_pos = int(st.trusted.pseudo_labels.sum())
    assert st.prior_rest == pytest.approx(
        (trainer.run.prior_u * trainer.run.n_u - trainer.run.n_p - n_pos)
        / (trainer.run.n_u - trainer.run.n_p - len(st.trusted)))

    def band_trainer(where: str) -> Trainer:
        t = Trainer(tiny_config(method="selfpu", selfpu={
            "warmup_epochs": 0, "rest_risk": "band", "reweight": False,
            "band_prior": where}), tiny_pu)
        t.strategy.select(0)
        return t

    # f_band from the validation split's labelled positives
    on_val = band_trainer("validation")
    t_lo, t_hi = score_band(scores, on_val.state.students[0].trusted)
    val = tiny_pu.val
    val_scores = 1 / (1 + np.exp(-trainer.predict_logits(st.model, val)))[val.labelled]
    f_val = float(((val_scores > t_lo) & (val_scores < t_hi)).mean())
    assert on_val.state.students[0].prior_rest == pytest.approx(
        band_prior(trainer.run.prior_u, trainer.run.n_u, len(st.trusted), f_val, trainer.run.n_p))
    # or from the training split's labelled positives (the ones the model fitted)
    on_train = band_trainer("training")
    f_band = len(on_train.state.students[0].band_pos) / on_train.run.n_p
    assert on_train.state.students[0].prior_rest == pytest.approx(
        band_prior(trainer.run.prior_u, trainer.run.n_u, len(on_train.state.students[0].trusted), f_band,
                   trainer.run.n_p))
    assert f_val != f_band  # the two estimates differ on this data, so both are checked
    batches = trainer.epoch_batches(np.random.default_rng(0))
    trainer.strategy.training_start(0, 2)
    layouts = trainer.strategy.layouts(EpochPlan.of(batches), 2)
    for batch, lay in zip(batches, layouts):
        rows = trainer.run.entries.base[batch]
        want = np.flatnonzero(trainer.run.entries.s[batch].astype(bool) & np.isin(rows, expected))
        assert lay.rows(0)["band_pos"].nonzero().flatten().tolist() == want.tolist()
    # the default ("prior") builds no band rows
    plain = Trainer(tiny_config(method="selfpu", selfpu={"warmup_epochs": 0}), tiny_pu)
    plain.strategy.select(0)
    assert plain.state.students[0].band_pos is None
    plain.strategy.training_start(0, 2)
    lay = plain.strategy.layouts(EpochPlan.of(batches), 2)[0]
    assert "band_pos" not in lay.rows(0)


# ------------------------------------------------------------------ mean-one weights


def _raw():
    # columns: both positive; entropy negative; both tiny (|u| <= 1e-3 * 0.4); both negative
    return torch.tensor([[0.3, -0.2, 1e-4, -0.1],
                         [0.1, 0.4, -1e-4, -0.3]])


def test_shrink_weights_let_a_tiny_sign_decide():
    w = calibration.normalise_weights(_raw(), batch_size=100, cap=1.0)
    assert w.ce.tolist() == pytest.approx([0.75, 0.0, 1.0, 0.0])
    assert w.pu.tolist() == pytest.approx([0.25, 1.0, 0.0, 1.0])


def test_mean_one_weights():
    w = calibration.normalise_weights(_raw(), batch_size=100, cap=1.0, mode="mean-one")
    assert w.ce.tolist() == pytest.approx([0.75, 0.0, 0.0, 0.0])  # the tiny one falls back
    b = np.array([0.25, 1.0, 1.0, 1.0]) * 4 / 3.25
    assert w.pu.tolist() == pytest.approx(b.tolist())
    assert float(w.pu.mean()) == pytest.approx(1.0)
    # every nnPU weight zero: all ones
    zero = calibration.normalise_weights(torch.tensor([[1.0, 2.0], [0.0, 0.0]]), 100, 1.0,
                                         mode="mean-one")
    assert zero.pu.tolist() == [1.0, 1.0]


@pytest.mark.parametrize(("mode", "fired"), [("shrink", True), ("mean-one", False)])
def test_non_negativity_is_decided_on_the_unweighted_risk(mode, fired):
    # one labelled positive at logit 0 (l(.,+1) = l(.,-1) = 0.5); rest U at +-ln 3 with
    # l(., -1) = 0.75, 0.25; prior 0.6 on both sides (c = 1); nnPU weights (0, 2)
    logits = torch.tensor([0.0, LN3, -LN3])
    # per row (the labelled row's weight is not read: it is not in U')
    weights = calibration.CalibrationWeights(torch.zeros(3), torch.tensor([1.0, 0.0, 2.0]),
                                             torch.zeros(2, 3), torch.tensor(0))
    sp = SelfPUConfig(reweight_risk=mode)
    rows = {"valid": torch.ones(3), "pos": torch.tensor([1.0, 0.0, 0.0]),
            "trusted": torch.zeros(3), "rest": torch.tensor([0.0, 1.0, 1.0])}
    _, pu_obj, stats = objective.student_loss(logits, rows, sp, 0.6, 0.0, 1.0, torch.zeros(3),
                                              lambda h, l_neg: weights)
    # unweighted R_n = 0.5 - 0.6 * 0.5 = 0.2 >= 0; weighted R_n = 0.5 / 2 - 0.3 = -0.05 < 0
    assert bool(stats["nn_correction"]) is fired
    r_p, r_n = 0.6 * 0.5, -0.05
    assert float(pu_obj) == pytest.approx(-r_n if fired else r_p + r_n)


# ------------------------------------------------------------------ positive oversampling


def test_positive_share_batches(tiny_pu):
    trainer = Trainer(tiny_config(method="nnpu", batch_size=32, positive_share=0.25), tiny_pu)
    n_p, n_u = trainer.run.n_p, trainer.run.n_u
    batches = trainer.epoch_batches(np.random.default_rng([0, 3]))
    assert len(batches) == math.ceil(n_u / 24)
    pos = [b[b < n_p] for b in batches]
    assert all(len(p) == 8 for p in pos)
    assert all(np.all(b[:8] < n_p) and np.all(b[8:] >= n_p) for b in batches)  # P rows first
    u_all = np.concatenate([b[b >= n_p] for b in batches])
    assert sorted(u_all.tolist()) == list(range(n_p, n_p + n_u))  # every U once
    drawn = np.concatenate(pos)
    for start in range(0, len(drawn) - n_p + 1, n_p):  # each full cycle is a permutation
        assert sorted(drawn[start:start + n_p].tolist()) == list(range(n_p))
    counts = np.bincount(drawn, minlength=n_p)
    assert counts.max() - counts.min() <= 1
    # the same seed and epoch give the same batches (resume-safe)
    again = trainer.epoch_batches(np.random.default_rng([0, 3]))
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))


def test_positive_share_with_distributed_sharding(tiny_pu):
    from adni_pu.distributed import DistributedRun

    cfg = tiny_config(method="nnpu", batch_size=32, positive_share=0.25)
    trainer = Trainer(cfg, tiny_pu, distributed=DistributedRun(0, 3))
    batches = trainer.epoch_batches(np.random.default_rng(0))
    assert len(batches) % 3 == 0 and len(batches) >= math.ceil(trainer.run.n_u / 24)
    assert all(np.sum(b < trainer.run.n_p) == 8 for b in batches)
    u_all = np.concatenate([b[b >= trainer.run.n_p] for b in batches])
    assert len(u_all) == trainer.run.n_u == len(set(u_all.tolist()))


def test_positive_share_is_checked():
    from adni_pu.config import ConfigError

    with pytest.raises(ConfigError, match=r"positive_share: expected a number in \[0, 1\), "
                                          "found 1.0"):
        tiny_config(positive_share=1.0)
    with pytest.raises(ConfigError, match="at least one labelled positive"):
        tiny_config(positive_share=0.001, batch_size=32)


# ------------------------------------------------------------------ end to end


def test_selfpu_with_all_three_settings_trains_and_resumes_exactly(tiny_pu, tmp_path):
    sp = {"warmup_epochs": 1, "self_paced_end": 3, "select_every": 1,
          "teacher_rampup_epochs": 1, "rest_risk": "band", "reweight_risk": "mean-one"}
    cfg = tiny_config(method="selfpu", epochs=4, positive_share=0.25, selfpu=sp)
    straight = Trainer(cfg, tiny_pu, tmp_path / "straight")
    straight.fit()
    assert all(st.band_pos is not None for st in straight.state.students)
    rows = straight.state.history
    assert all(math.isfinite(r["train/student1/loss"]) for r in rows)
    assert "train/student1/pu_weight_mean" in rows[1]
    assert rows[1]["train/student1/pu_weight_mean"] == pytest.approx(1.0)

    from test_trainer import _interrupt_after

    interrupted = Trainer(cfg, tiny_pu, tmp_path / "resumed")
    _interrupt_after(interrupted, 3)  # phase 3: no selection, the band comes from the checkpoint
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    resumed = Trainer(cfg, tiny_pu, tmp_path / "resumed")
    resumed.fit()
    assert resumed.state.start_epoch == 3
    for s1, s2 in zip(straight.state.students, resumed.state.students):
        assert np.array_equal(s1.band_pos, s2.band_pos)
        assert s1.prior_rest == s2.prior_rest
        for (k, v1), v2 in zip(s1.model.state_dict().items(), s2.model.state_dict().values()):
            torch.testing.assert_close(v1, v2, msg=k)
    assert straight.state.best["score"] == pytest.approx(resumed.state.best["score"])


def test_prior_rest_truth_is_the_true_positive_fraction_left_in_u(tiny_pu):
    cfg = tiny_config(method="selfpu", epochs=2, selfpu={
        "warmup_epochs": 1, "self_paced_end": 2, "select_every": 1, "rest_risk": "band",
        "reweight": False, "rates": [0.3], "teachers": False, "student_consistency": "none"})
    trainer = Trainer(cfg, tiny_pu)
    row = trainer.fit().history[-1]
    st = trainer.state.students[0]
    unlabelled = tiny_pu.train.unlabelled_indices(tiny_pu.scheme)
    rest = np.setdiff1d(unlabelled, st.trusted.indices)
    assert len(st.trusted) > 0 and len(rest) < len(unlabelled)
    # the band risk's U' leaves out the labelled positives' copies (case-control)
    rest = rest[~tiny_pu.train.labelled[rest]]
    assert row["trusted/model/prior_rest_truth"] == pytest.approx(tiny_pu.train.truth[rest].mean())


def test_band_rest_rows_leave_out_the_labelled_copies(tiny_pu):
    """Case-control D_U holds a copy of every labelled positive; the band risk's U' rows
    must not (they are known positives at every score, not a sample of the band)."""
    cfg = tiny_config(method="selfpu", selfpu={"warmup_epochs": 0, "rest_risk": "band",
                                               "reweight": False})
    trainer = Trainer(cfg, tiny_pu)
    trainer.strategy.select(0)
    batches = trainer.epoch_batches(np.random.default_rng(0))
    members = [s.trusted.membership(len(tiny_pu.train))[0] for s in trainer.state.students]
    trainer.strategy.training_start(0, 2)
    seen_copy = False
    for batch, lay in zip(batches, trainer.strategy.layouts(EpochPlan.of(batches), 2)):
        rows = trainer.run.entries.base[batch]
        s_b = trainer.run.entries.s[batch]
        copies = (s_b == 0) & tiny_pu.train.labelled[rows]
        seen_copy |= bool(copies.any())
        rest = set(lay.rows(0)["rest"].nonzero().flatten().tolist())
        assert not rest & set(np.flatnonzero(copies).tolist())
        want = (s_b == 0) & ~members[0][rows] & ~tiny_pu.train.labelled[rows]
        assert sorted(rest) == np.flatnonzero(want).tolist()
    assert seen_copy  # the batches did hold copies


def test_band_correction_term_is_unbiased_over_batches():
    """sum over in-band rows / (labelled rows * f): a batch without an in-band positive adds
    zero, the others are scaled up, and the mean over batches is the in-band mean."""
    g = torch.tensor([0.0, 1.0, -1.0, 2.0])  # four labelled positives, rows 1 and 3 in band
    u = torch.tensor([0.5, -0.5])
    l_neg = torch.sigmoid(g)  # sigmoid loss l(g, -1) = sigmoid(g)
    f = 0.5  # half of all labelled positives are in the band
    full = losses.pu_risk(g, u, 0.4, 0.3, logits_p_neg=g[[1, 3]], p_neg_fraction=f)
    by_hand = (l_neg[1] + l_neg[3]) / (4 * f)
    scale = (1 - 0.4) / (1 - 0.3)
    assert float(full.negative) == pytest.approx(
        scale * (float(torch.sigmoid(u).mean()) - 0.3 * float(by_hand)))
    # split into two batches: one holds no in-band positive and adds zero to the term
    a = losses.pu_risk(g[[0, 2]], u, 0.4, 0.3, logits_p_neg=g[[]], p_neg_fraction=f)
    b = losses.pu_risk(g[[1, 3]], u, 0.4, 0.3, logits_p_neg=g[[1, 3]], p_neg_fraction=f)
    assert float(a.negative) == pytest.approx(scale * float(torch.sigmoid(u).mean()))
    assert (float(a.negative) + float(b.negative)) / 2 == pytest.approx(float(full.negative))
    # in expectation over batches the term is the mean over the in-band positives
    assert float(by_hand) == pytest.approx(float(l_neg[[1, 3]].mean()))
    zero = losses.pu_risk(g, u, 0.4, 0.3, logits_p_neg=g[[1, 3]], p_neg_fraction=0.0)
    assert float(zero.negative) == pytest.approx(scale * float(torch.sigmoid(u).mean()))


def test_band_risk_without_replacement_is_refused():
    from adni_pu.errors import ConfigError
    from adni_pu.pu.config import SelfPUConfig

    with pytest.raises(ConfigError, match="replacement=false"):
        SelfPUConfig(rest_risk="band", replacement=False)


# ------------------------------------------------- the risk selection re-applies

@pytest.mark.parametrize("scheme", ["case-control", "censoring"])
def test_selection_risk_is_the_trainers_pu_risk(scheme: str) -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 50))
    labelled = rng.random(50) < 0.3
    u_mask = np.ones(50, bool) if scheme == "case-control" else ~labelled
    prior, prior_u = 0.4, (0.4 if scheme == "case-control" else 0.3)
    got = criteria.pu_risks(sigmoid(-logits), sigmoid(logits), labelled, u_mask, prior,
                             prior_u)
    for row, value in zip(logits, got):
        t = torch.from_numpy(row)
        want = losses.pu_risk(t[torch.from_numpy(labelled)], t[torch.from_numpy(u_mask)],
                              prior, prior_u).unbiased
        assert value == pytest.approx(float(want), abs=1e-12)
