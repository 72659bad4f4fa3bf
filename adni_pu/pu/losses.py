"""PU risks: sigmoid loss, uPU (du Plessis et al. 2015), nnPU (Kiryo et al. 2017), naive PN.

Logits ``g`` are one number per example; labels are +1 / -1 for the sigmoid loss. The
risks allow the unlabelled set to have its own positive fraction ``prior_u`` (censoring, or
what is left of D_U after a trusted set is removed); with ``prior_u = prior`` they are the
usual case-control forms:

    R_p = pi E_P[l(g, +1)]
    R_n = c (E_U[l(g, -1)] - pi_u E_P[l(g, -1)]),   c = (1 - pi) / (1 - pi_u)
    uPU = R_p + R_n;  nnPU reports R_p + max(0, R_n)

The correction term pi_u E_P[l(g, -1)] may average over its own set of labelled positives
(``logits_p_neg``): on D_U minus a trusted set, only the labelled positives that resemble
the positives left in it (Self-PU's score band, ``rest_risk = "band"``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def sigmoid_loss(logits: torch.Tensor, sign: float | torch.Tensor) -> torch.Tensor:
    """Per-example sigmoid loss l(z, y) = sigmoid(-y z)."""
    return torch.sigmoid(-sign * logits)


@dataclass
class PURisk:
    """The positive and negative parts of a PU risk (both scalar tensors)."""

    positive: torch.Tensor
    negative: torch.Tensor

    @property
    def unbiased(self) -> torch.Tensor:
        """uPU: R_p + R_n (may be negative on a flexible model)."""
        return self.positive + self.negative

    @property
    def non_negative(self) -> torch.Tensor:
        """The reported nnPU value R_p + max(0, R_n)."""
        return self.positive + torch.clamp(self.negative, min=0.0)


def _mean(values: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    if values.numel() == 0:
        return values.sum()  # zero that keeps the graph and dtype
    if weights is None:
        return values.mean()
    return (weights * values).sum() / values.numel()


def pu_risk(
    logits_p: torch.Tensor,
    logits_u: torch.Tensor,
    prior: float,
    prior_u: float | None = None,
    weights_u: torch.Tensor | None = None,
    logits_p_neg: torch.Tensor | None = None,
    p_neg_fraction: float | None = None,
) -> PURisk:
    """The two parts of the sigmoid-loss PU risk from labelled-positive and unlabelled logits.

    ``weights_u`` (one per unlabelled example) scales each example's contribution to
    E_U[l(g, -1)]; the self-calibration step uses it. ``logits_p_neg``: the labelled
    positives of the correction term pi_u E_P[l(g, -1)] (None: ``logits_p``; empty: the
    term is zero), while R_p keeps every labelled positive. ``p_neg_fraction`` f: the
    ``logits_p_neg`` rows are the batch's labelled rows that belong to a subset holding a
    known fraction f of all labelled positives, and the term's mean over that subset is
    estimated without bias as ``sum(l(g, -1)) / (len(logits_p) * f)`` (a batch without such a
    row then contributes zero, which the 1/f weighting of the others balances); f = 0 makes
    the term zero.
    """
    prior_u = prior if prior_u is None else prior_u
    scale = (1.0 - prior) / (1.0 - prior_u)
    p_neg = logits_p if logits_p_neg is None else logits_p_neg
    r_p = prior * _mean(sigmoid_loss(logits_p, 1.0), None)
    if p_neg_fraction is None:
        correction = _mean(sigmoid_loss(p_neg, -1.0), None)
    elif p_neg_fraction <= 0.0 or logits_p.numel() == 0:
        correction = p_neg.sum() * 0.0
    else:
        correction = sigmoid_loss(p_neg, -1.0).sum() / (logits_p.numel() * p_neg_fraction)
    r_n = scale * (_mean(sigmoid_loss(logits_u, -1.0), weights_u) - prior_u * correction)
    return PURisk(r_p, r_n)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the rows where ``mask`` is 1 along the last axis (one mean per
    model of a stack); zero where the mask holds no row."""
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def masked_pu_risk(logits: torch.Tensor, pos: torch.Tensor, unl: torch.Tensor,
                   prior: float | torch.Tensor, prior_u: float | torch.Tensor,
                   weights_u: torch.Tensor | None = None) -> PURisk:
    """:func:`pu_risk` for a stack of models: ``logits`` M x B, the labelled-positive and
    unlabelled rows as 0/1 masks, priors per model (M) or shared; one risk per model."""
    scale = (1.0 - prior) / (1.0 - prior_u)
    loss_u = sigmoid_loss(logits, -1.0)
    r_p = prior * masked_mean(sigmoid_loss(logits, 1.0), pos)
    correction = masked_mean(loss_u, pos)
    weighted = loss_u if weights_u is None else weights_u * loss_u
    r_n = scale * (masked_mean(weighted, unl) - prior_u * correction)
    return PURisk(r_p, r_n)


def upu_loss(logits_p: torch.Tensor, logits_u: torch.Tensor, prior: float,
             prior_u: float | None = None) -> torch.Tensor:
    """The unbiased PU risk, to minimise directly."""
    return pu_risk(logits_p, logits_u, prior, prior_u).unbiased


def nnpu_step_objective(risk: PURisk, beta: float = 0.0, gamma: float = 1.0,
                        decide_on: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Kiryo's step rule: what to back-propagate, and whether the correction fired.

    If R_n < -beta, step on -gamma R_n (gradient ascent on the negative part); otherwise
    step on R_p + R_n. The branch is taken with ``torch.where`` (no host synchronisation);
    ``fired`` is a boolean scalar tensor. The branch not taken gets a zero gradient.
    ``decide_on``: the R_n that the test reads, when it is not ``risk.negative`` (the
    self-calibration's ``mean-one`` mode decides on the unweighted R_n, steps on the
    weighted one).
    """
    r_n = risk.negative if decide_on is None else decide_on
    fired = r_n.detach() < -beta
    objective = torch.where(fired, -gamma * risk.negative, risk.positive + risk.negative)
    return objective, fired


def naive_pn_loss(logits: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Treat unlabelled as negative: binary cross entropy against the PU label ``s``."""
    return F.binary_cross_entropy_with_logits(logits, s.float())


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-example cross entropy of sigmoid(logits) against targets in [0, 1]."""
    return F.binary_cross_entropy_with_logits(logits, target.float(), reduction="none")


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Per-example binary entropy of sigmoid(logits): CE of a prediction against itself."""
    p = torch.sigmoid(logits)
    return -(p * F.logsigmoid(logits) + (1 - p) * F.logsigmoid(-logits))


def zero_one_pu_risk(logits_p: torch.Tensor, logits_u: torch.Tensor, prior: float) -> float:
    """uPU risk with the 0-1 loss: an unbiased estimate of the error rate from PU data."""
    pos_err = (logits_p <= 0).float().mean() if logits_p.numel() else torch.tensor(0.0)
    pos_as_neg = (logits_p > 0).float().mean() if logits_p.numel() else torch.tensor(0.0)
    u_as_pos = (logits_u > 0).float().mean() if logits_u.numel() else torch.tensor(0.0)
    return float(prior * pos_err + u_as_pos - prior * pos_as_neg)
