"""The objective is written once (adni_pu.pu.objective): a stack of M networks' losses, with
padded rows and per-network priors, equal each network's alone; the band risk and the meta
step work over masks; no other module defines the loss terms."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest
import torch

from adni_pu.pu import calibration, losses, objective
from adni_pu.pu.config import SelfPUConfig, TrainConfig
from adni_pu.pu.stack import Stack

M, B = 3, 16
LENGTHS = (16, 13, 16)  # network 1's batch is padded by three rows


def _batch(seed: int = 0):
    """Logits, PU labels, row sets (with a band) and the other student's and teacher's
    logits of M networks, network 1's last rows padding."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(M, B, generator=g, requires_grad=True)
    s = (torch.rand(M, B, generator=g) < 0.3).float()
    valid = torch.zeros(M, B)
    for m, n in enumerate(LENGTHS):
        valid[m, :n] = 1.0
    trusted = (torch.rand(M, B, generator=g) < 0.3).float() * (1 - s) * valid
    rows = {"valid": valid, "pos": s * valid, "unl": (1 - s) * valid, "trusted": trusted,
            "rest": (1 - s) * (1 - trusted) * valid, "outside": (1 - trusted) * valid,
            "band_pos": s * (torch.rand(M, B, generator=g) < 0.5).float() * valid}
    extra = {"targets": torch.rand(M, B, generator=g) * trusted,
             "other": torch.randn(M, B, generator=g),
             "teacher": torch.randn(M, B, generator=g)}
    return logits, s, rows, extra


def _fake_calibrate(h: torch.Tensor, l_neg: torch.Tensor, rows, mode: str):
    """A per-row stand-in for the meta step: weights from the terms themselves."""
    raw = torch.stack([h.detach() - 0.5, 0.6 - l_neg.detach()])
    return calibration.normalise_weights(raw, rows["valid"].sum(-1, keepdim=True), 0.25, mode,
                                         rows["rest"])


CASES = [
    ("naive", 1, {}),
    ("upu", 1, {}),
    ("nnpu", 1, {}),
    ("selfpu", 1, {}),
    ("selfpu", 2, {"labels": "entropy"}),
    ("selfpu", 2, {"reweight_risk": "mean-one", "rest_risk": "band"}),
    ("selfpu", 3, {}),
    ("selfpu", 3, {"student_consistency": "per_batch", "rest_risk": "band"}),
    ("selfpu", 3, {"student_consistency": "none", "labels": "hard"}),
]


@pytest.mark.parametrize("method, phase, sp", CASES)
def test_a_stack_of_networks_gets_each_networks_loss(method, phase, sp):
    cfg = TrainConfig(method=method, beta=0.0, gamma=0.8, selfpu=SelfPUConfig(**sp))
    logits, s, rows, extra = _batch()
    prior = torch.tensor([0.4, 0.3, 0.5])
    prior_rest = torch.tensor([0.35, 0.2, 0.45])
    band = torch.tensor([0.5, 0.25, 0.0]) if cfg.selfpu.rest_risk == "band" else None
    mode = cfg.selfpu.reweight_risk

    def loss_of(lg, s_, rows_, **kw):
        inputs = {} if phase == 1 else {"calibrate": lambda h, l_neg: _fake_calibrate(
            h, l_neg, rows_, mode), "targets": kw.pop("targets"), "epoch": 51.5}
        if phase < 3:
            kw.pop("other"), kw.pop("teacher")
        return objective.step_loss(
            objective.LossInputs(lg, s_, rows_, **kw, **inputs), cfg, phase)

    stacked, stats = loss_of(logits, s, rows, prior=prior, prior_u=prior,
                             prior_rest=prior_rest, band_fraction=band, **extra)
    assert stacked.shape == (M,)
    stacked.sum().backward()
    grad = logits.grad.clone()
    for m, n in enumerate(LENGTHS):
        one = logits.detach()[m, :n].clone().requires_grad_(True)
        alone, one_stats = loss_of(
            one, s[m, :n], {k: v[m, :n] for k, v in rows.items()}, prior=float(prior[m]),
            prior_u=float(prior[m]), prior_rest=float(prior_rest[m]),
            band_fraction=None if band is None else float(band[m]),
            **{k: v[m, :n] for k, v in extra.items()})
        alone.backward()
        assert torch.allclose(stacked[m], alone, atol=1e-6), m
        assert torch.allclose(grad[m, :n], one.grad, atol=1e-6), m
        assert not grad[m, n:].any()  # padding rows get no gradient
        assert set(one_stats) == set(stats)
        for key, value in one_stats.items():
            ours = stats[key][m] if isinstance(stats[key], torch.Tensor) else stats[key]
            assert float(ours) == pytest.approx(float(value), abs=1e-6), (m, key)


def test_network_inputs_stack_along_the_network_axis():
    """A method's per-network inputs, stacked, give each network's own step inputs: the
    numbers as M-vectors, each network's targets gathered at its own batch rows, the meta
    step only with a validation batch, the teacher's logits only with a teacher."""
    parts = [objective.NetworkInputs(0.4, 0.3, 0.2, 0.5, torch.tensor([0.0, 1.0, 0.5])),
             objective.NetworkInputs(0.6, 0.5, 0.1, 0.25, torch.tensor([1.0, 0.0, 0.25]))]
    stacked = objective.NetworkInputs.stack(parts, torch.device("cpu"))
    assert torch.equal(stacked.prior, torch.tensor([0.4, 0.6]))
    assert torch.equal(stacked.prior_rest, torch.tensor([0.2, 0.1]))
    assert torch.equal(stacked.band_fraction, torch.tensor([0.5, 0.25]))
    idx, s = torch.tensor([[2, 0], [2, 1]]), torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    rows = {"valid": torch.ones(2, 2)}
    logits, teacher = torch.randn(2, 2), torch.nn.Identity()
    sp = SelfPUConfig()
    both = stacked.at(objective.StepBatch(logits, s, idx, epoch=1.5), rows, logits,
                      torch.nn.Identity(), sp, teacher=teacher)
    assert torch.equal(both.targets, torch.tensor([[0.5, 0.0], [0.25, 0.0]]))
    assert both.calibrate is None and torch.equal(both.teacher, logits) and both.epoch == 1.5
    for m, part in enumerate(parts):
        one = part.at(objective.StepBatch(logits[m], s[m], idx[m]), {"valid": torch.ones(2)},
                      logits[m], torch.nn.Identity(), sp)
        assert torch.equal(one.targets, both.targets[m]) and one.teacher is None
        assert one.prior == pytest.approx(float(both.prior[m]))
    none = objective.NetworkInputs.stack([objective.NetworkInputs(0.4, 0.4, 0.4)] * 2,
                                         torch.device("cpu"))
    assert none.band_fraction is None and none.targets is None


def test_the_engines_and_the_objective_do_not_know_the_methods():
    """The population engine and the objective read a method through its typed inputs
    only: neither imports a strategy."""
    root = Path(objective.__file__).parent
    for name in ("population.py", "objective.py"):
        tree = ast.parse((root / name).read_text(encoding="utf-8"))
        imported = {node.module or "" for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom)}
        assert not {m for m in imported if "strategies" in m}, name
        names = {getattr(node, "id", getattr(node, "attr", None)) for node in ast.walk(tree)}
        assert not names & {"SelfPU", "VPU", "Baseline"}, name


def test_band_correction_over_masks():
    """The band's correction term: only the band rows, over all labelled rows times f; f as
    a number or one per network; f = 0 makes it zero (and no NaN gradient)."""
    logits = torch.tensor([[0.0, 1.0, -1.0, 2.0], [0.5, 0.0, 1.0, -2.0]], requires_grad=True)
    pos = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    unl = 1 - pos
    band = torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    fraction = torch.tensor([0.5, 0.0])
    risk = losses.masked_pu_risk(logits, pos, unl, 0.4, 0.3, pos_neg=band,
                                 p_neg_fraction=fraction)
    one = losses.pu_risk(logits[0, :2], logits[0, 2:], 0.4, 0.3, logits_p_neg=logits[0, 1:2],
                         p_neg_fraction=0.5)
    assert torch.allclose(risk.negative[0], one.negative)
    l_neg = torch.sigmoid(logits[0, 1])  # l(g, -1)
    expected = (0.6 / 0.7) * (torch.sigmoid(logits[0, 2:]).mean() - 0.3 * l_neg / (2 * 0.5))
    assert torch.allclose(risk.negative[0], expected)
    zero = (0.6 / 0.7) * torch.sigmoid(logits[1, 3:]).mean()  # f = 0: no correction
    assert torch.allclose(risk.negative[1], zero)
    as_number = losses.masked_pu_risk(logits[1], pos[1], unl[1], 0.4, 0.3, pos_neg=band[1],
                                      p_neg_fraction=0.0)
    assert torch.allclose(as_number.negative, zero)
    risk.unbiased.sum().backward()
    assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize("hypergradient", ["double-backward", "jvp"])
@pytest.mark.parametrize("meta_objective", ["pu_risk", "pn_ce"])
def test_the_meta_step_of_a_stack_is_each_networks(hypergradient, meta_objective):
    """objective.calibrator and validation_objective on a stack of two MLPs (one batch
    padded) give each MLP's weights on its own batch."""
    from adni_pu.models.mlp import MLP

    torch.manual_seed(0)
    nets = [MLP(3, 8, 2) for _ in range(2)]
    sp = SelfPUConfig(hypergradient=hypergradient, meta_objective=meta_objective,
                      meta_step_size=0.5, meta_ce_cap=1.0)
    stack = Stack([copy.deepcopy(n) for n in nets]).train()
    x, x_val = torch.randn(2, 12, 3), torch.randn(2, 8, 3)
    truth = (torch.rand(2, 8) < 0.6).float()
    pos_val = torch.tensor([[1.0] * 3 + [0.0] * 5, [1.0] * 2 + [0.0] * 6])
    unl_val = torch.tensor([[0.0] * 3 + [1.0] * 5, [0.0] * 2 + [1.0] * 4 + [0.0] * 2])
    valid = torch.ones(2, 12)
    valid[1, 10:] = 0
    g = torch.Generator().manual_seed(1)
    rest = (torch.rand(2, 12, generator=g) < 0.6).float() * valid
    rows = {"valid": valid, "rest": rest}

    def weights(model, xb, rows_, xv, tv, pv, uv, logits):
        obj = objective.validation_objective(model, xv, tv, pv, uv, 0.4, sp)
        calibrate = objective.calibrator(model, xb, rows_, obj, sp)
        return calibrate(losses.entropy(logits), losses.sigmoid_loss(logits, -1.0))

    w = weights(stack, x, rows, x_val, truth, pos_val, unl_val, stack(x, valid))
    for m, (net, n, nv) in enumerate(zip(nets, (12, 10), (8, 6))):
        net.train()
        one = weights(net, x[m, :n], {k: v[m, :n] for k, v in rows.items()}, x_val[m, :nv],
                      truth[m, :nv], pos_val[m, :nv], unl_val[m, :nv], net(x[m, :n]))
        assert torch.allclose(w.ce[m, :n], one.ce, atol=1e-6), m
        assert torch.allclose(w.pu[m, :n], one.pu, atol=1e-6), m
        assert torch.allclose(w.raw[:, m, :n] * rest[m, :n], one.raw * rest[m, :n],
                              rtol=1e-4, atol=1e-9), m
    assert (w.ce * rest).sum() > 0  # the check compared some entropy weight


def test_the_loss_terms_are_defined_once():
    """No module of the package but objective.py defines the paper's loss terms."""
    package = Path(objective.__file__).resolve().parents[1]
    names = {"step_loss", "baseline_loss", "student_loss", "distillation", "teacher_term",
             "vpu_loss", "mix_inputs"}
    where: dict[str, list[str]] = {}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
                where.setdefault(node.name, []).append(path.name)
    assert where == {name: ["objective.py"] for name in names}


# ---------------------------------------------------------- one network's terms
# The per-batch objective as functions of tensors and settings, for one network: its B
# logits with the row sets as 0/1 masks.

def _one_net_batch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(12, generator=g)
    s = torch.tensor([1, 1, 1, 1] + [0] * 8)
    return logits, s, torch.arange(4), torch.arange(4, 12)


def _one_net_rows(**sets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Row sets of a 12-row batch as masks, from index tensors."""
    rows = {"valid": torch.ones(12)}
    for name, idx in sets.items():
        rows[name] = torch.zeros(12).index_fill_(0, idx, 1.0)
    return rows


def test_baselines_are_the_risks_of_losses():
    logits, s, pos, unl = _one_net_batch()
    rows = _one_net_rows(pos=pos, unl=unl)
    naive, stats = objective.baseline_loss("naive", logits, s, rows, 0.4, 0.4, 0.0, 1.0)
    assert torch.allclose(naive, losses.naive_pn_loss(logits, s)) and "nn_correction" not in stats
    risk = losses.pu_risk(logits[pos], logits[unl], 0.4, 0.4)
    upu, _ = objective.baseline_loss("upu", logits, s, rows, 0.4, 0.4, 0.0, 1.0)
    assert torch.equal(upu, risk.unbiased)
    _, stats = objective.baseline_loss("nnpu", logits, s, rows, 0.4, 0.4, 0.0, 1.0)
    assert torch.equal(stats["loss"], risk.non_negative.detach().double())


def test_student_loss_mixes_trusted_cross_entropy_and_the_pu_risk_by_the_trusted_share():
    logits, s, pos, _ = _one_net_batch()
    trusted, rest = torch.arange(4, 7), torch.arange(7, 12)
    rows = _one_net_rows(pos=pos, trusted=trusted, rest=rest)
    targets = rows["trusted"].clone()  # soft label 1 on the trusted rows
    sp = SelfPUConfig(reweight=False)
    loss, pu_obj, stats = objective.student_loss(logits, rows, sp, 0.3, 0.0, 1.0, targets,
                                                 None)
    ce = losses.soft_cross_entropy(logits[trusted], torch.ones(3)).mean()
    risk = losses.pu_risk(logits[pos], logits[rest], 0.3)
    expected_obj, _ = losses.nnpu_step_objective(risk, 0.0, 1.0)
    assert torch.allclose(pu_obj, expected_obj)
    assert torch.allclose(loss, 3 / 12 * ce + 9 / 12 * expected_obj)
    assert float(stats["trusted_in_batch"]) == pytest.approx(3 / 12)


def test_distillation_without_a_second_student_or_teacher_adds_nothing():
    logits, s, _, _ = _one_net_batch()
    rows = _one_net_rows(outside=torch.arange(12))
    stats: dict = {}
    extra = objective.distillation(logits, s, rows, logits.sum(), SelfPUConfig(), 5.0, None,
                                   None, stats)
    assert float(extra) == 0.0 and stats == {}
