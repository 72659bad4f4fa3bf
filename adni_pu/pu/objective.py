"""The training objective of every method, written once for every engine.

Each function takes the logits of a batch with its rows along the last axis and networks
along a leading one: M x B for a stack of M networks (a run's two students, or the 2K
students of a population, :mod:`adni_pu.pu.population`), or one network's B logits (the
ordinary engine, :mod:`adni_pu.pu.trainer`, one student at a time). The batch's row sets
come as 0/1 masks of the same shape (:data:`Rows`); every reduction runs over the rows, so
a loss has one value per network and a statistic is one per network (a tensor) or a number
that a setting fixes. Nothing here reads a trainer: an engine supplies the masks, the
priors (numbers, or one per network), the trusted targets, the other student's and the
mean teacher's logits and the self-calibration step (:func:`calibrator`).

- :class:`LossInputs`: what the loss reads (built by :meth:`NetworkInputs.at` from a
  method's :class:`NetworkInputs`, stacked for a population, and the step's
  :class:`StepBatch`);
- :func:`step_loss`: which terms apply in which phase (the one dispatch);
- :func:`baseline_loss`: naive PN, uPU or nnPU (the baselines, and Self-PU's warm-up);
- :func:`vpu_loss`: VPU's variational loss and MixUp regulariser (no class prior); the
  engine mixes the inputs (:func:`mix_inputs`, with the partners and weights the strategy
  drew on the host) and passes the mixed rows' logits;
- :func:`student_loss`: phases 2-3: cross entropy (or entropy) on the student's trusted
  set, the non-negative PU risk on the rest (U'), its unlabelled rows weighted by the
  self-calibration step where it runs, mixed by the trusted share of the batch;
- :func:`distillation` and :func:`teacher_term`: phase 3: consistency with the other
  student on hard examples and with the student's mean teacher;
- :func:`validation_objective` and :func:`calibrator`: the self-calibration (meta) step.

The risks and per-example losses are :mod:`adni_pu.pu.losses`; the hypergradient and the
weights' normalisation :mod:`adni_pu.pu.calibration`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from adni_pu.pu import calibration, losses
from adni_pu.pu.config import SelfPUConfig, TrainConfig
from adni_pu.pu.teacher import sigmoid_rampup, teacher_logits

Stats = dict[str, Any]
Rows = dict[str, torch.Tensor]
"""A batch's row sets as 0/1 float masks (the logits' shape): "valid" (rows that are
examples; a stack pads shorter batches), "pos" (labelled, s = 1), "unl" (unlabelled,
s = 0); for Self-PU from phase 2 on, per student, "trusted" (its trusted D_U rows), "rest"
(U': D_U outside the trusted set), "outside" (every row outside it) and, with
``rest_risk = "band"``, "band_pos" (the labelled positives inside the trusted set's score
band); for VPU "marginal" (the rows drawn from the training distribution: D_U under the
case-control scheme, every row under censoring)."""
Scalar = float | torch.Tensor
"""A number shared by every network, or one per network (M)."""
Calibrate = Callable[[torch.Tensor, torch.Tensor], calibration.CalibrationWeights]
"""(entropy, sigmoid loss as a negative) of every row -> the self-calibration weights."""


@dataclass(frozen=True)
class ValidationBatch:
    """A validation batch of the self-calibration (meta) step: inputs, true labels, and its
    labelled-positive ("pos") and unlabelled ("unl") rows as 0/1 masks (Bv, or M x Bv for a
    stack, padding rows in neither)."""

    x: Any
    truth: torch.Tensor
    pos: torch.Tensor
    unl: torch.Tensor

    @classmethod
    def of(cls, x: Any, s: torch.Tensor, truth: torch.Tensor) -> ValidationBatch:
        """One network's batch whose labelled positives are the rows where ``s`` is 1."""
        pos = s.float()
        return cls(x, truth, pos, 1.0 - pos)

    def objective(self, model: nn.Module, prior: Scalar, sp: SelfPUConfig
                  ) -> calibration.ValidationObjective:
        """The meta step's validation objective of ``model`` on this batch
        (:func:`validation_objective`)."""
        return validation_objective(model, self.x, self.truth, self.pos, self.unl, prior, sp)


@dataclass(frozen=True)
class StepBatch:
    """One optimiser step's batch, shared by every network of it: inputs, PU labels,
    training-split indices (B, or M x B for a stack), the epoch plus the fraction of it done
    (a number, or a device tensor in a step replayed as a graph), the meta step's validation
    batch (None: no meta step in this step) and VPU's MixUp weight (a number, or M)."""

    x: Any
    s: torch.Tensor
    idx: torch.Tensor
    epoch: Scalar = 0.0
    validation: ValidationBatch | None = None
    lam: Scalar = 1.0


@dataclass(frozen=True)
class LossInputs:
    """Everything :func:`step_loss` reads besides the settings: one network's logits (B)
    with its batch, or M networks' (M x B) stacked along a leading axis.

    ``s``: the PU labels; ``rows``: the row sets (:data:`Rows`); ``prior`` and ``prior_u``:
    the data priors; ``prior_rest``: the nnPU prior on U'; ``band_fraction``: with
    ``rest_risk = "band"``, the fraction of labelled positives inside the band
    (:func:`student_loss`); ``targets``: the soft label of every row (zero outside the
    trusted set; None with ``labels = "entropy"``); ``epoch``: the epoch plus the fraction
    of it done; ``calibrate``: the meta step (None: no reweighting in this batch);
    ``other``: the other student's logits (None: no partner); ``teacher``: the mean
    teacher's logits (None: no teacher yet); ``mixed`` and ``lam``: VPU's mixed rows'
    logits and the batch's mixing weight (None: no MixUp)."""

    logits: torch.Tensor
    s: torch.Tensor
    rows: Rows
    prior: Scalar
    prior_u: Scalar
    prior_rest: Scalar
    band_fraction: Scalar | None = None
    targets: torch.Tensor | None = None
    epoch: Scalar = 0.0
    calibrate: Calibrate | None = None
    other: torch.Tensor | None = None
    teacher: torch.Tensor | None = None
    mixed: torch.Tensor | None = None
    lam: Scalar = 1.0


@dataclass(frozen=True)
class NetworkInputs:
    """What a method knows of one network for an epoch (its strategy's
    :meth:`~adni_pu.pu.strategies.Baseline.network_inputs`), or of M networks stacked
    (:meth:`stack`): the data priors, the nnPU prior on U', the band's share of the
    labelled positives (``rest_risk = "band"``) and the soft label of every training
    example (N, or M x N; None where the loss reads none). :meth:`at` turns it into a
    step's :class:`LossInputs`; neither side knows the method's class."""

    prior: Scalar
    prior_u: Scalar
    prior_rest: Scalar
    band_fraction: Scalar | None = None
    targets: torch.Tensor | None = None

    @classmethod
    def stack(cls, parts: Sequence[NetworkInputs], device: torch.device) -> NetworkInputs:
        """M networks' inputs along a leading axis: numbers as float32 M-vectors on
        ``device``, the targets as M x N (all or none of the parts have each)."""
        def numbers(values: list[Any]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        first = parts[0]
        return cls(numbers([p.prior for p in parts]), numbers([p.prior_u for p in parts]),
                   numbers([p.prior_rest for p in parts]),
                   None if first.band_fraction is None else
                   numbers([p.band_fraction for p in parts]),
                   None if first.targets is None else torch.stack([p.targets for p in parts]))

    def at(self, batch: StepBatch, rows: Rows, logits: torch.Tensor, model: nn.Module,
           sp: SelfPUConfig, *, other: torch.Tensor | None = None,
           teacher: nn.Module | None = None, mixed: torch.Tensor | None = None) -> LossInputs:
        """The loss inputs of ``model`` (one network, or a stack) on ``batch``: its
        ``logits`` and row sets, the targets of the batch's rows, the meta step where the
        batch has a validation batch (:func:`calibrator`), the other student's logits
        (``other``), the mean ``teacher``'s logits on the batch and the mixed rows'
        logits (``mixed``)."""
        calibrate = None
        if batch.validation is not None:
            calibrate = calibrator(model, batch.x, rows,
                                   batch.validation.objective(model, self.prior, sp), sp)
        return LossInputs(
            logits, batch.s, rows, self.prior, self.prior_u, self.prior_rest,
            self.band_fraction,
            None if self.targets is None else torch.gather(self.targets, -1, batch.idx),
            batch.epoch, calibrate, other,
            None if teacher is None else teacher_logits(teacher, batch.x), mixed, batch.lam)


def step_loss(inputs: LossInputs, cfg: TrainConfig, phase: int
              ) -> tuple[torch.Tensor, Stats]:
    """Every network's loss on this batch in ``phase``, and its statistics.

    A baseline, and Self-PU in phase 1: :func:`baseline_loss`; VPU: :func:`vpu_loss`;
    Self-PU in phase 2: :func:`student_loss`; in phase 3 plus :func:`distillation`.
    """
    i = inputs
    if cfg.method == "vpu":
        return vpu_loss(cfg, i.logits, i.rows, i.mixed, i.lam)
    if cfg.method != "selfpu" or phase == 1:
        return baseline_loss(cfg.method, i.logits, i.s, i.rows, i.prior, i.prior_u, cfg.beta,
                             cfg.gamma)
    sp = cfg.selfpu
    loss, pu_obj, stats = student_loss(i.logits, i.rows, sp, i.prior_rest, cfg.beta,
                                       cfg.gamma, i.targets, i.calibrate, i.band_fraction)
    if phase == 3:
        loss = loss + distillation(i.logits, i.s, i.rows, pu_obj, sp, i.epoch, i.other,
                                   i.teacher, stats)
    stats["loss"] = loss.detach().double()
    return loss, stats


def baseline_loss(method: str, logits: torch.Tensor, s: torch.Tensor, rows: Rows,
                  prior: Scalar, prior_u: Scalar, beta: float, gamma: float
                  ) -> tuple[torch.Tensor, Stats]:
    """Naive PN (cross entropy against ``s``), uPU, or nnPU with Kiryo's step rule (any
    other ``method``: Self-PU's warm-up)."""
    if method == "naive":
        loss = losses.naive_pn_loss(logits, s, rows["valid"])
        return loss, {"loss": loss.detach().double()}
    risk = losses.masked_pu_risk(logits, rows["pos"], rows["unl"], prior, prior_u)
    if method == "upu":
        return risk.unbiased, {"loss": risk.unbiased.detach().double()}
    objective, fired = losses.nnpu_step_objective(risk, beta, gamma)
    return objective, {"loss": risk.non_negative.detach().double(),
                       "nn_correction": fired.double()}


def vpu_loss(cfg: TrainConfig, logits: torch.Tensor, rows: Rows,
             mixed: torch.Tensor | None, lam: Scalar) -> tuple[torch.Tensor, Stats]:
    """VPU (Chen et al., NeurIPS 2020): the variational loss of the labelled ("pos") and
    training-distribution ("marginal") rows, plus ``vpu.mix_weight`` times the MixUp
    regulariser where ``mixed`` (the logits of the mixed rows) is given."""
    var = losses.variational_loss(logits, rows["pos"], rows["marginal"])
    loss, stats = var, {"variational": var.detach().double()}
    if mixed is not None:
        reg = losses.mixup_regulariser(logits, mixed, lam, rows["marginal"])
        loss = var + cfg.vpu.mix_weight * reg
        stats["mixup"] = reg.detach().double()
    stats["loss"] = loss.detach().double()
    return loss, stats


def mix_inputs(x: Any, partner: torch.Tensor, lam: Scalar) -> Any:
    """VPU's MixUp inputs: every row ``lam x + (1 - lam) x[partner]``, where ``partner``
    holds each row's labelled positive as a row position of the batch (B, or M x B for a
    stack's M x B x ... inputs) and ``lam`` the batch's weight (a number, or M). Inputs
    may be a tensor or a mapping / sequence of tensors (one per branch of a model)."""
    if isinstance(x, dict):
        return {key: mix_inputs(v, partner, lam) for key, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(mix_inputs(v, partner, lam) for v in x)
    if partner.dim() == 1:
        other = x[partner]
    else:
        other = x[torch.arange(len(x), device=x.device)[:, None], partner]
    if isinstance(lam, torch.Tensor) and lam.dim() > 0:
        lam = lam.view(-1, *[1] * (x.dim() - 1)).to(x.dtype)
    return lam * x + (1 - lam) * other


def student_loss(logits: torch.Tensor, rows: Rows, sp: SelfPUConfig, prior_rest: Scalar,
                 beta: float, gamma: float, targets: torch.Tensor | None,
                 calibrate: Calibrate | None, band_fraction: Scalar | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, Stats]:
    """Phases 2-3 without the distillation: returns (loss, the nnPU step objective,
    statistics).

    Cross entropy of the "trusted" rows against ``targets`` (their entropy with ``labels =
    "entropy"``) plus the nnPU risk of the labelled rows and U' ("rest") at ``prior_rest``,
    mixed by the trusted share of the batch. With ``calibrate`` the rest rows' terms are
    reweighted (an entropy term added, the nnPU term scaled); with ``reweight_risk =
    "mean-one"`` Kiryo's test reads the unweighted R_n. ``band_fraction`` (``rest_risk =
    "band"``): the correction term reads only the "band_pos" rows, which hold that
    fraction of all labelled positives (:func:`adni_pu.pu.losses.masked_pu_risk`).
    """
    pos, trusted, rest = rows["pos"], rows["trusted"], rows["rest"]
    if sp.labels == "entropy":
        ce = losses.masked_mean(losses.entropy(logits), trusted)
    else:
        ce = losses.masked_mean(losses.soft_cross_entropy(logits, targets), trusted)
    stats: Stats = {}
    weights_u = None
    entropy_term = torch.zeros_like(ce)
    if calibrate is not None:
        h = losses.entropy(logits)
        w = calibrate(h, losses.sigmoid_loss(logits, -1.0))
        weights_u = w.pu
        entropy_term = (w.ce * h * rest).sum(-1) / rest.sum(-1).clamp(min=1)
        stats.update(w.stats(rest))
    pos_neg = None if band_fraction is None else rows["band_pos"]
    risk = losses.masked_pu_risk(logits, pos, rest, prior_rest, prior_rest, weights_u,
                                 pos_neg, band_fraction)
    decide_on = None
    if weights_u is not None and sp.reweight_risk == "mean-one":
        decide_on = losses.masked_pu_risk(logits, pos, rest, prior_rest, prior_rest, None,
                                          pos_neg, band_fraction).negative
    pu_obj, fired = losses.nnpu_step_objective(risk, beta, gamma, decide_on)
    frac = trusted.sum(-1) / rows["valid"].sum(-1)
    loss = frac * ce + (1.0 - frac) * (pu_obj + entropy_term)
    stats.update({"trusted_ce": ce.detach().double(),
                  "nnpu": risk.non_negative.detach().double(),
                  "nn_correction": fired.double(), "trusted_in_batch": frac.double()})
    return loss, pu_obj, stats


def distillation(logits: torch.Tensor, s: torch.Tensor, rows: Rows, pu_obj: torch.Tensor,
                 sp: SelfPUConfig, epoch: Scalar, other: torch.Tensor | None,
                 teacher: torch.Tensor | None, stats: Stats) -> torch.Tensor:
    """Phase 3: consistency with the other student (``other``'s logits, a detached target)
    on the hard rows outside the trusted set, per example or gated per batch
    (``student_consistency``), plus the ramped-up consistency with the mean teacher
    (``teacher``'s logits) over every row. Adds its statistics to ``stats``."""
    extra = torch.zeros_like(pu_obj)
    prob = torch.sigmoid(logits)
    outside, valid = rows["outside"] * rows["valid"], rows["valid"]
    if other is not None and sp.student_consistency != "none":
        mse = (prob - torch.sigmoid(other.detach())) ** 2
        if sp.student_consistency == "per_example":
            n_out = outside.sum(-1).clamp(min=1)
            sign = torch.where(s == 1, 1.0, -1.0)
            pu_each = losses.sigmoid_loss(logits, sign).detach()
            hard = (pu_each > sp.alpha * mse.detach()) * outside
            l_st = (mse * hard).sum(-1) / n_out
            stats["hard_fraction"] = hard.sum(-1).double() / n_out.double()
        else:
            batch_mse = losses.masked_mean(mse, outside)
            # compared in float64, as the value read on the host once was
            gate = batch_mse.detach().double() < sp.batch_gate * pu_obj.detach().double().abs()
            l_st = torch.where(gate, batch_mse, torch.zeros_like(batch_mse))
            stats["hard_fraction"] = gate.double()
        stats["student_consistency"] = l_st.detach().double()
        extra = extra + sp.student_weight * l_st
    if teacher is not None:
        l_t = losses.masked_mean((prob - torch.sigmoid(teacher)) ** 2, valid)
        extra = extra + teacher_term(l_t, sp, epoch, stats)
    return extra


def teacher_term(l_t: torch.Tensor, sp: SelfPUConfig, epoch: Scalar, stats: Stats
                 ) -> torch.Tensor:
    """The mean-teacher consistency ``l_t`` weighted by its ramp-up at ``epoch`` (a number,
    or a device tensor in a step replayed as a graph; adds its statistics to ``stats``)."""
    weight = sp.teacher_weight * sigmoid_rampup(epoch - sp.self_paced_end,
                                                sp.teacher_rampup_epochs)
    stats["teacher_consistency"] = l_t.detach().double()
    stats["teacher_weight"] = (weight.double().expand(l_t.shape)
                               if isinstance(weight, torch.Tensor) else weight)
    return weight * l_t


# ---------------------------------------------------------------------- the meta step


def validation_objective(model: nn.Module, x_val: Any, truth: torch.Tensor,
                         pos: torch.Tensor, unl: torch.Tensor, prior: Scalar,
                         sp: SelfPUConfig) -> calibration.ValidationObjective:
    """The meta step's validation objective as a function of ``model``'s parameters (one
    network, or a :class:`~adni_pu.pu.stack.Stack` whose objectives are summed: each
    network's weights see only its own): the uPU risk of the validation batch's labelled
    (``pos``) and unlabelled (``unl``) rows, or with ``meta_objective = "pn_ce"`` the cross
    entropy against the true labels ``truth`` on both. BatchNorm as ``meta_bn`` says."""
    valid = pos + unl

    def objective(params: dict[str, torch.Tensor]) -> torch.Tensor:
        out = calibration.functional_forward(model, params, x_val, sp.meta_bn, valid)
        if sp.meta_objective == "pn_ce":
            return losses.naive_pn_loss(out, truth, valid).sum()
        return losses.masked_pu_risk(out, pos, unl, prior, prior).unbiased.sum()

    return objective


def calibrator(model: nn.Module, x: Any, rows: Rows,
               objective: calibration.ValidationObjective, sp: SelfPUConfig) -> Calibrate:
    """The self-calibration step of ``model`` (one network, or a stack) on this batch
    (inputs ``x``): the hypergradient of ``objective`` (:func:`validation_objective`) with
    respect to the "rest" rows' weights, by double backward or forward mode
    (``hypergradient``), normalised and capped (:func:`adni_pu.pu.calibration.
    calibration_weights`)."""
    rest, valid = rows["rest"], rows["valid"]
    settings = calibration.MetaStep(sp.meta_step_size, sp.meta_ce_cap, sp.meta_sign_flip,
                                    sp.reweight_risk)
    terms_at = None
    if sp.hypergradient == "jvp":
        def terms_at(params: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            # BatchNorm normalises by the batch, as in the training forward
            out = calibration.functional_forward(model, params, x, valid=valid).float()
            return losses.entropy(out), losses.sigmoid_loss(out, -1.0)

    def calibrate(h: torch.Tensor, l_neg: torch.Tensor) -> calibration.CalibrationWeights:
        return calibration.calibration_weights(
            model, h, l_neg, objective, settings, valid.sum(-1, keepdim=True), terms_at, rest)

    return calibrate
