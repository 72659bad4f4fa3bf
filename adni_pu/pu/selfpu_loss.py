"""The training objective of one student, per batch: functions of tensors and settings.

This is the one place to change the Self-PU loss (the paper's Eq. 6 with its parts):

- :func:`baseline_loss`: naive PN, uPU or nnPU (phase 1, and the baselines throughout);
- :func:`student_loss`: phases 2-3: cross-entropy (or entropy) on the student's trusted
  set, the non-negative PU risk on the rest, weighted by the self-calibration (meta) step
  when ``reweight`` is on, mixed by the trusted share of the batch;
- :func:`distillation`: phase 3: consistency with the other student on hard examples and
  with the student's mean teacher.

The trainer (:mod:`adni_pu.pu.trainer`) builds the batch layout and calls these; the risk
estimators and the per-example losses are in :mod:`adni_pu.pu.losses`, the meta step in
:mod:`adni_pu.pu.calibration`, the teacher in :mod:`adni_pu.pu.teacher`. Statistics come
back as device tensors or host floats (read once per epoch, so no host sync per batch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from adni_pu.pu import losses
from adni_pu.pu.config import SelfPUConfig
from adni_pu.pu.teacher import sigmoid_rampup

Stats = dict[str, Any]


def baseline_loss(method: str, logits: torch.Tensor, s: torch.Tensor, pos: Any, unl: Any,
                  prior: float, prior_u: float, beta: float, gamma: float
                  ) -> tuple[torch.Tensor, Stats]:
    """The loss of ``naive``, ``upu`` or ``nnpu`` on one batch (``pos``/``unl`` select the
    labelled and unlabelled rows)."""
    if method == "naive":
        loss = losses.naive_pn_loss(logits, s)
        return loss, {"loss": loss.detach().double()}
    risk = losses.pu_risk(logits[pos], logits[unl], prior, prior_u)
    if method == "upu":
        return risk.unbiased, {"loss": risk.unbiased.detach().double()}
    objective, fired = losses.nnpu_step_objective(risk, beta, gamma)
    return objective, {"loss": risk.non_negative.detach().double(),
                       "nn_correction": fired.double()}


def student_loss(logits: torch.Tensor, *, pos: Any, trusted: Any, rest_u: Any, n: int,
                 phase: int, sp: SelfPUConfig, prior_rest: float, beta: float, gamma: float,
                 trusted_target: Callable[[], torch.Tensor],
                 calibrate: Callable[[torch.Tensor, torch.Tensor], Any] | None,
                 pos_neg: Any = None, band_fraction: float | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor, Stats]:
    """Phases 2-3 loss of one student on one batch, without the phase-3 distillation.

    ``trusted`` are the batch rows in the student's trusted set, ``rest_u`` the unlabelled
    rows outside it; ``trusted_target()`` the soft labels of the trusted rows;
    ``calibrate(entropy, negative loss)`` the meta step's weights (None: no reweighting;
    the strategy passes it only in the phases where the meta step runs).
    ``pos_neg``: the labelled-positive rows of the nnPU correction term (``rest_risk="band"``:
    those inside the score band; None: every labelled row; none in the batch: the term is
    zero). With ``sp.reweight_risk="mean-one"`` Kiryo's test reads the unweighted R_n.
    Returns (loss, the nnPU step objective, statistics).
    """
    n_trusted, n_rest = len(trusted), len(rest_u)
    stats: Stats = {}
    if n_trusted:
        t_logits = logits[trusted]
        if sp.labels == "entropy":
            ce = losses.entropy(t_logits).mean()
        else:
            ce = losses.soft_cross_entropy(t_logits, trusted_target()).mean()
    else:
        ce = logits.sum() * 0.0
    u_logits = logits[rest_u]
    # whether the meta step runs in this phase is the caller's rule (it passes calibrate)
    reweight = calibrate is not None and n_rest > 0
    entropy_term = logits.sum() * 0.0
    weights_u = None
    if reweight:
        h = losses.entropy(u_logits)
        l_neg = losses.sigmoid_loss(u_logits, -1.0)
        w = calibrate(h, l_neg)
        weights_u = w.pu
        entropy_term = (w.ce * h).sum() / n_rest
        stats.update(w.stats())
    p_neg = None if pos_neg is None else logits[pos_neg]
    risk = losses.pu_risk(logits[pos], u_logits, prior_rest, weights_u=weights_u,
                          logits_p_neg=p_neg, p_neg_fraction=band_fraction)
    decide_on = None
    if weights_u is not None and sp.reweight_risk == "mean-one":
        decide_on = losses.pu_risk(logits[pos], u_logits, prior_rest, logits_p_neg=p_neg,
                                   p_neg_fraction=band_fraction).negative
    pu_obj, fired = losses.nnpu_step_objective(risk, beta, gamma, decide_on)
    frac = n_trusted / n
    loss = frac * ce + (1.0 - frac) * (pu_obj + entropy_term)
    stats.update({"trusted_ce": ce.detach().double(),
                  "nnpu": risk.non_negative.detach().double(),
                  "nn_correction": fired.double(), "trusted_in_batch": frac})
    return loss, pu_obj, stats


def distillation(logits: torch.Tensor, other: torch.Tensor | None, s: torch.Tensor,
                 outside: torch.Tensor, pu_obj: torch.Tensor, sp: SelfPUConfig, epoch: float,
                 teacher_loss: Callable[[], torch.Tensor] | None, stats: Stats
                 ) -> torch.Tensor:
    """Phase 3: student-student consistency on hard examples outside the trusted set, plus
    the ramped-up mean-teacher consistency (``teacher_loss()``; None before teachers exist).
    Adds its statistics to ``stats``."""
    extra = logits.sum() * 0.0
    prob = torch.sigmoid(logits)
    n_out = len(outside)
    if other is not None and sp.student_consistency != "none":
        mse = (prob[outside] - torch.sigmoid(other[outside]).detach()) ** 2
        if sp.student_consistency == "per_example":
            sign = torch.where(s[outside] == 1, 1.0, -1.0)
            pu_each = losses.sigmoid_loss(logits[outside], sign).detach()
            hard = pu_each > sp.alpha * mse.detach()
            l_st = (mse * hard).sum() / max(n_out, 1)
            stats["hard_fraction"] = hard.float().mean().double() if n_out else 0.0
        else:
            batch_mse = mse.mean() if n_out else extra
            # compared in float64, as the value read on the host was before
            gate = (batch_mse.detach().double()
                    < sp.batch_gate * pu_obj.detach().double().abs())
            l_st = torch.where(gate, batch_mse, extra)
            stats["hard_fraction"] = gate.double()
        stats["student_consistency"] = l_st.detach().double()
        extra = extra + sp.student_weight * l_st
    if teacher_loss is not None:
        extra = extra + teacher_term(teacher_loss(), sp, epoch, stats)
    return extra


def teacher_term(l_t: torch.Tensor, sp: SelfPUConfig, epoch: float | torch.Tensor,
                 stats: Stats) -> torch.Tensor:
    """The mean-teacher consistency ``l_t`` weighted by its ramp-up at ``epoch`` (a number,
    or a device tensor in a step replayed as a graph; adds its statistics to ``stats``)."""
    weight = sp.teacher_weight * sigmoid_rampup(epoch - sp.self_paced_end,
                                                sp.teacher_rampup_epochs)
    stats["teacher_consistency"] = l_t.detach().double()
    stats["teacher_weight"] = (weight.double().expand(l_t.shape)
                               if isinstance(weight, torch.Tensor) else weight)
    return weight * l_t
