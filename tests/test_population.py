"""A population per step: K runs trained as one stack equal K separate runs (to rounding),
the stack's pieces (masked BatchNorm, masked weights, masked risks) equal their one-model
forms, and what the stacked step does not do is refused."""

from __future__ import annotations

import copy
import math
import time

import numpy as np
import pytest
import torch
from conftest import blobs, tiny_config
from torch import nn

from adni_pu.data.pu import PUData, make_pu_data
from adni_pu.errors import ConfigError
from adni_pu.models.mlp import MLP
from adni_pu.pu import calibration, losses
from adni_pu.pu.config import TrainConfig
from adni_pu.pu.population import fit_population
from adni_pu.pu.stack import Stack
from adni_pu.pu.teacher import MeanTeacher, batchnorm_buffers
from adni_pu.pu.trainer import Trainer
from adni_pu.workflows.benchmark import with_estimated_prior

SP = {"warmup_epochs": 1, "self_paced_end": 3, "select_every": 1, "teacher_rampup_epochs": 1}


@pytest.fixture(scope="module")
def two_seeds():
    """The blobs PU problem split with seeds 0 and 1: their training splits hold 94 and 93
    labelled positives, so every batch and validation batch differs in size by a row or so
    (the stack pads them)."""
    x, y = blobs(1200, 0)
    xt, yt = blobs(400, 1)
    return [make_pu_data(x, y, xt, yt, n_labelled=120, prior=0.4, val_fraction=0.2, seed=s,
                         name="blobs") for s in (0, 1)]


def _assert_runs_equal(alone: list[Trainer], together: list[Trainer], tol: float) -> None:
    for a, b in zip(alone, together):
        assert len(a.state.history) == len(b.state.history) == a.cfg.epochs
        for row_a, row_b in zip(a.state.history, b.state.history):
            assert set(row_a) == set(row_b)
            for key, va in row_a.items():
                vb = row_b[key]
                if key.startswith("time/"):
                    continue
                if isinstance(va, float):
                    if math.isnan(va):
                        assert math.isnan(vb), key
                    else:
                        assert vb == pytest.approx(va, rel=tol, abs=tol), (row_a["epoch"], key)
                else:
                    assert va == vb, (row_a["epoch"], key)
        models_a, models_b = ({n.name: n.module for n in t.state.networks()} for t in (a, b))
        assert set(models_a) == set(models_b)
        for name, model in models_a.items():
            for (pname, pa), pb in zip(model.state_dict().items(),
                                       models_b[name].state_dict().values()):
                # weights after 5 epochs at lr 1e-2 carry more rounding than the metrics
                assert torch.allclose(pa.float(), pb.float(), rtol=10 * tol, atol=10 * tol), \
                    (name, pname)
        for sa, sb in zip(a.state.students, b.state.students):
            # the same members with the same pseudo-labels (their order is the score
            # ranking, in which rounding may swap two neighbours; training reads membership)
            order_a, order_b = np.argsort(sa.trusted.indices), np.argsort(sb.trusted.indices)
            assert np.array_equal(sa.trusted.indices[order_a], sb.trusted.indices[order_b])
            assert np.array_equal(sa.trusted.pseudo_labels[order_a],
                                  sb.trusted.pseudo_labels[order_b])


# Every setting that the objective branches on, in at least one case (SP: phases 1, 2, 2,
# 3, 3; the meta step in phase 2, and in phase 3 where a case says so).
@pytest.mark.parametrize("method, sp, settings", [
    ("nnpu", {}, {}),
    ("naive", {}, {}),
    ("upu", {}, {}),
    ("selfpu", {}, {}),
    ("selfpu", {"hypergradient": "jvp", "reweight_risk": "mean-one", "meta_bn": "running"}, {}),
    ("selfpu", {"labels": "entropy", "student_consistency": "per_batch",
                "teacher_average": "uniform", "teacher_bn": "recompute",
                "meta_sign_flip": True, "reweight_in_phase3": True}, {}),
    # hard targets, the meta step's cross entropy on labelled validation examples, and the
    # rest's prior left uncorrected
    ("selfpu", {"labels": "hard", "meta_objective": "pn_ce", "correct_prior": False},
     {"pn_validation": True}),
    # one student (no partner), no teacher, no student consistency
    ("selfpu", {"labels": "hard", "rates": [0.3], "teachers": False,
                "student_consistency": "none"}, {}),
    # two students: consistency between them without teachers; teachers without it, and no
    # meta step at all
    ("selfpu", {"teachers": False}, {}),
    ("selfpu", {"student_consistency": "none", "reweight": False}, {}),
    # the band risk on U' (its own correction-term rows and fraction), with the mean-one
    # weights and labelled-positive oversampling
    ("selfpu", {"rest_risk": "band", "reweight_risk": "mean-one"}, {"positive_share": 0.25}),
    ("selfpu", {"rest_risk": "band", "band_prior": "validation"}, {}),
])
def test_a_population_equals_separate_runs(two_seeds, method, sp, settings):
    cfgs = [tiny_config(method=method, epochs=5, seed=s, selfpu={**SP, **sp}, **settings)
            for s in (0, 1)]
    alone = [Trainer(c, d) for c, d in zip(cfgs, two_seeds)]
    for t in alone:
        t.fit()
    together = [Trainer(c, d) for c, d in zip(cfgs, two_seeds)]
    results = fit_population(together)
    assert all(r.complete for r in results)
    _assert_runs_equal(alone, together, 1e-5)


@pytest.mark.parametrize("method", ["nnpu", "selfpu"])
def test_a_population_of_runs_with_their_own_priors_equals_separate_runs(two_seeds, method):
    """Runs that differ in the class prior as well (each seed's estimate under ``--prior
    estimate``) stack too: every network's risks take its own run's prior."""
    def run(seed: int, prior: float) -> tuple[TrainConfig, PUData]:
        cfg = tiny_config(method=method, epochs=5, seed=seed, selfpu=SP)
        data, cfg = with_estimated_prior(two_seeds[seed], cfg, prior)
        return cfg, data

    runs = [run(0, 0.33), run(1, 0.47)]
    alone = [Trainer(c, d) for c, d in runs]
    for t in alone:
        t.fit()
    together = [Trainer(c, d) for c, d in runs]
    assert all(r.complete for r in fit_population(together))
    assert [t.run.prior for t in together] == [0.33, 0.47]
    _assert_runs_equal(alone, together, 1e-5)
    # the test has teeth: had the stack given run 1 the first run's prior, it would differ
    wrong = Trainer(*run(1, 0.33))
    wrong.fit()
    right, other = alone[1].state.history[-1], wrong.state.history[-1]
    assert any(right[k] != other[k] for k in right
               if isinstance(right[k], float) and not k.startswith("time/"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("method, sp", [("nnpu", {}), ("selfpu", {}),
                                        ("selfpu", {"hypergradient": "jvp"})])
def test_a_captured_population_equals_the_eager_one(two_seeds, method, sp):
    """The step replayed as a CUDA graph (adni_pu/pu/replay.py) trains what the eager step
    trains, every phase, teachers included."""
    cfgs = [tiny_config(method=method, epochs=5, seed=s, device="cuda", selfpu={**SP, **sp})
            for s in (0, 1)]
    eager = [Trainer(c, d) for c, d in zip(cfgs, two_seeds)]
    fit_population(eager)
    captured = [Trainer(c, d) for c, d in zip(cfgs, two_seeds)]
    assert all(r.complete for r in fit_population(captured, capture=True))
    _assert_runs_equal(eager, captured, 1e-5)


def test_population_run_folders_resume_alone(two_seeds, tmp_path):
    """Each run of a population keeps an ordinary run folder: stopped by its deadline after
    each epoch, the population resumes; then one run continues as a population of one and
    the other with the ordinary engine, and both end as runs trained alone throughout."""
    cfgs = [tiny_config(method="selfpu", epochs=5, seed=s, selfpu=SP) for s in (0, 1)]
    alone = [Trainer(c, d) for c, d in zip(cfgs, two_seeds)]
    for t in alone:
        t.fit()
    runs = [tmp_path / f"seed{s}" for s in (0, 1)]
    for _ in range(2):  # a deadline already passed: each call trains one epoch
        pieces = [Trainer(c, d, r) for c, d, r in zip(cfgs, two_seeds, runs)]
        results = fit_population(pieces, deadline=time.monotonic())
        assert not any(r.complete for r in results)
    for r in runs:
        assert (r / "checkpoints" / "last.pt").is_file()
        assert len((r / "metrics.csv").read_text().strip().splitlines()) == 3
    resumed = [Trainer(c, d, r) for c, d, r in zip(cfgs, two_seeds, runs)]
    fit_population(resumed[:1])
    resumed[1].fit()
    assert [t.state.start_epoch for t in resumed] == [2, 2]
    _assert_runs_equal(alone, resumed, 1e-5)


def test_population_refuses_what_it_does_not_do(two_seeds):
    base = tiny_config(method="selfpu", epochs=2, selfpu=SP)
    with pytest.raises(ConfigError, match="differ in \\['lr'\\]"):
        fit_population([Trainer(base, two_seeds[0]),
                        Trainer(tiny_config(method="selfpu", epochs=2, lr=0.5, selfpu=SP),
                                two_seeds[1])])
    with pytest.raises(ConfigError, match="compile"):
        fit_population([Trainer(tiny_config(method="nnpu", compile=True), two_seeds[0])])
    with pytest.raises(ConfigError, match="capture on device 'cpu'"):
        fit_population([Trainer(tiny_config(method="nnpu", device="cpu"), two_seeds[0])],
                       capture=True)
    def with_dropout():
        return nn.Sequential(nn.Linear(2, 4), nn.Dropout(0.5), nn.Linear(4, 1), nn.Flatten(0))

    with pytest.raises(ConfigError, match="dropout"):
        fit_population([Trainer(tiny_config(method="nnpu"), two_seeds[0],
                                 model_factory=with_dropout)])


def test_stack_runs_each_member_with_batchnorm_over_its_valid_rows():
    torch.manual_seed(0)
    members = [MLP(5, 8, 2) for _ in range(3)]
    copies = [copy.deepcopy(m) for m in members]
    stack = Stack(members).train()
    x = torch.randn(3, 10, 5)
    valid = torch.ones(3, 10)
    valid[1, 7:] = 0
    out = stack(x, valid)
    assert torch.allclose(out[0], copies[0](x[0]), atol=1e-6)
    assert torch.allclose(out[1, :7], copies[1](x[1, :7]), atol=1e-6)
    copies[2](x[2])
    stack.unstack_into(members)
    for member, ref in zip(members, copies):
        for a, b in zip(member.state_dict().values(), ref.state_dict().values()):
            assert torch.allclose(a.float(), b.float(), atol=1e-6)
    # a teacher of the stack averages its BatchNorm statistics, or leaves them alone
    assert batchnorm_buffers(stack) == {f"net__{i}__{b}" for i in (1, 4) for b in
                                        ("running_mean", "running_var", "num_batches_tracked")}
    teacher = MeanTeacher(Stack(members), bn="recompute", copy=False)
    before = teacher.model.net__1__running_mean.clone()
    teacher.update(stack)
    assert torch.equal(teacher.model.net__1__running_mean, before)


def test_masked_weights_and_risks_equal_the_one_model_forms():
    torch.manual_seed(1)
    raw = torch.randn(2, 3, 12)
    mask = (torch.rand(3, 12) > 0.4).float()
    for mode in ("shrink", "mean-one"):
        stacked = calibration.normalise_weights(raw, torch.tensor([[12.0], [9.0], [12.0]]),
                                                0.25, mode, mask)
        for m, n in enumerate((12, 9, 12)):
            rows = mask[m].bool()
            one = calibration.normalise_weights(raw[:, m, rows], n, 0.25, mode)
            assert torch.allclose(stacked.ce[m, rows], one.ce)
            assert torch.allclose(stacked.pu[m, rows], one.pu)
            assert stacked.capped[m] == one.capped
    logits = torch.randn(3, 12)
    pos = (torch.arange(12) < 4).float().expand(3, 12)
    unl = 1.0 - pos
    prior = torch.tensor([0.3, 0.4, 0.5])
    risk = losses.masked_pu_risk(logits, pos, unl * mask, prior, prior)
    for m in range(3):
        one = losses.pu_risk(logits[m, :4], logits[m, 4:][mask[m, 4:].bool()], float(prior[m]))
        assert torch.allclose(risk.positive[m], one.positive)
        assert torch.allclose(risk.negative[m], one.negative)


def test_a_stack_of_cnns_equals_each_cnn():
    """Grouped convolutions and the masked BatchNorm in 4-D: outputs and gradients of a
    stack of CNN-13s (channels-last inputs, one member's batch padded) equal each CNN's.
    In float64, so that what is compared is the arithmetic, not float32's rounding (which
    BatchNorm over four images amplifies to about 1e-4 of a gradient)."""
    from adni_pu.models import build_model

    torch.manual_seed(0)
    members = [build_model("cnn13", image_size=8, width=4).double() for _ in range(2)]
    copies = [copy.deepcopy(m) for m in members]
    stack = Stack(members).train()
    x = torch.randn(2, 6, 3, 8, 8, dtype=torch.float64)
    valid = torch.ones(2, 6, dtype=torch.float64)
    valid[1, 4:] = 0
    out = stack(x.contiguous(memory_format=torch.channels_last_3d), valid)
    (out * valid).sum().backward()
    for m, (ref, rows) in enumerate(zip(copies, (6, 4))):
        expected = ref(x[m, :rows].contiguous(memory_format=torch.channels_last))
        expected.sum().backward()
        assert torch.allclose(out[m, :rows], expected, rtol=1e-10, atol=1e-10)
        for name, p in ref.named_parameters():
            grad = stack.params[name.replace(".", "__")].grad[m]
            assert torch.allclose(grad, p.grad, rtol=1e-10, atol=1e-10), name


@pytest.mark.parametrize("amp", [False, True])
def test_a_population_of_cnns_with_augmentation(amp):
    """CNN-13, random crops and flips drawn per seed, channels-last, bfloat16 autocast:
    the population's first epoch follows the runs alone, and all three phases run. (After
    the first selection the runs part: on 8-pixel noise images many scores tie, and a
    rounding-level difference moves an example in or out of a trusted set.)"""
    from test_trainer_speed import _tiny_images

    x, y = _tiny_images()
    xt, yt = _tiny_images(64, seed=1)
    datas = [make_pu_data(x, y, xt, yt, n_labelled=24, prior=0.4, val_fraction=0.25, seed=s)
             for s in (0, 1)]
    cfgs = [tiny_config(method="selfpu", model="cnn13", model_args={"image_size": 8, "width": 4},
                        batch_size=32, lr=1e-3, epochs=3, seed=s, augment="crop-flip",
                        channels_last=True, amp=amp, selfpu={**SP, "self_paced_end": 2})
            for s in (0, 1)]
    alone = [Trainer(c, d) for c, d in zip(cfgs, datas)]
    for t in alone:
        t.fit()
    together = [Trainer(c, d) for c, d in zip(cfgs, datas)]
    fit_population(together)
    tol = 2e-2 if amp else 1e-3  # bfloat16 keeps 8 bits of each product
    for a, b in zip(alone, together):
        assert [r["phase"] for r in b.state.history] == [1, 2, 3]
        assert set(a.state.history[-1]) == set(b.state.history[-1])
        for key, value in a.state.history[0].items():
            if isinstance(value, float) and not key.startswith("time/") and key.endswith("risk"):
                assert b.state.history[0][key] == pytest.approx(value, rel=tol), key
        assert all(math.isfinite(v) for k, v in b.state.history[-1].items()
                   if isinstance(v, float) and k.startswith("train/"))


def test_the_stack_forward_traces_as_one_graph():
    """torch.compile sees the whole stacked forward, padding mask included, as one graph
    without breaks (what a compiled or CUDA-graph step needs)."""
    import torch._dynamo as dynamo

    torch.manual_seed(0)
    stack = Stack([MLP(5, 8, 2) for _ in range(3)]).train()
    x = torch.randn(3, 10, 5)
    valid = torch.ones(3, 10)
    valid[2, 6:] = 0
    explained = dynamo.explain(stack)(x, valid)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    dynamo.reset()
