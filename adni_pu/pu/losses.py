"""PU risks: sigmoid loss, uPU (du Plessis et al. 2015), nnPU (Kiryo et al. 2017), naive PN.

Logits ``g`` are one number per example; labels are +1 / -1 for the sigmoid loss. The
risks allow the unlabelled set to have its own positive fraction ``prior_u`` (censoring, or
what is left of D_U after a trusted set is removed); with ``prior_u = prior`` they are the
usual case-control forms:

    R_p = pi E_P[l(g, +1)]
    R_n = c (E_U[l(g, -1)] - pi_u E_P[l(g, -1)]),   c = (1 - pi) / (1 - pi_u)
    uPU = R_p + R_n;  nnPU reports R_p + max(0, R_n)

The correction term pi_u E_P[l(g, -1)] may average over its own set of labelled positives
(``pos_neg``): on D_U minus a trusted set, only the labelled positives that resemble the
positives left in it (Self-PU's score band, ``rest_risk = "band"``).

The risk is defined once, over a batch's rows with 0/1 masks (:func:`masked_pu_risk`, for
one network or a stack); :func:`pu_risk` takes separate vectors of logits and calls it.
The numpy form for many rows of recorded logits, :func:`adni_pu.pu.criteria.pu_risks`, is
checked against it by the tests.

VPU's loss, which needs no prior, is here too (:func:`variational_loss`,
:func:`mixup_regulariser`).
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


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the rows where ``mask`` is 1 along the last axis (one mean per
    network of a stack); zero where the mask holds no row."""
    return (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def masked_pu_risk(logits: torch.Tensor, pos: torch.Tensor, unl: torch.Tensor,
                   prior: float | torch.Tensor, prior_u: float | torch.Tensor | None = None,
                   weights_u: torch.Tensor | None = None, pos_neg: torch.Tensor | None = None,
                   p_neg_fraction: float | torch.Tensor | None = None) -> PURisk:
    """The two parts of the sigmoid-loss PU risk (module docstring): its one definition.

    ``logits``: the batch's rows along the last axis, with leading axes for networks or
    none (M x B, or B); ``pos`` and ``unl``: the labelled-positive and unlabelled rows as
    0/1 masks of that shape; priors per network (M) or shared; one risk per network.
    ``weights_u`` (per row) scales each unlabelled row's contribution to E_U[l(g, -1)]; the
    self-calibration step uses it. ``pos_neg``: the labelled rows of the correction term
    pi_u E_P[l(g, -1)] (None: ``pos``; none in the batch: the term is zero), while R_p keeps
    every labelled positive. ``p_neg_fraction`` f: the ``pos_neg`` rows are the batch's
    labelled rows that belong to a subset holding a known fraction f of all labelled
    positives, and the term's mean over that subset is estimated without bias as
    ``sum(l(g, -1) over pos_neg) / (labelled rows * f)`` (a batch without such a row then
    contributes zero, which the 1/f weighting of the others balances); f = 0 makes the term
    zero.
    """
    prior_u = prior if prior_u is None else prior_u
    scale = (1.0 - prior) / (1.0 - prior_u)
    loss_u = sigmoid_loss(logits, -1.0)
    r_p = prior * masked_mean(sigmoid_loss(logits, 1.0), pos)
    p_neg = pos if pos_neg is None else pos_neg
    if p_neg_fraction is None:
        correction = masked_mean(loss_u, p_neg)
    else:
        correction = _subset_mean(loss_u, p_neg, pos.sum(-1), p_neg_fraction)
    weighted = loss_u if weights_u is None else weights_u * loss_u
    r_n = scale * (masked_mean(weighted, unl) - prior_u * correction)
    return PURisk(r_p, r_n)


def _subset_mean(values: torch.Tensor, rows: torch.Tensor, n_all: torch.Tensor,
                 fraction: float | torch.Tensor) -> torch.Tensor:
    """sum(``values`` over ``rows``) / (``n_all`` x ``fraction``), zero where ``fraction``
    is 0 (without a host read when it is a tensor)."""
    total = (values * rows).sum(-1)
    if not isinstance(fraction, torch.Tensor):
        return total * 0.0 if fraction <= 0.0 else total / (n_all.clamp(min=1) * fraction)
    some = fraction > 0
    share = torch.where(some, fraction, torch.ones_like(fraction))
    return torch.where(some, total / (n_all.clamp(min=1) * share), torch.zeros_like(total))


def pu_risk(
    logits_p: torch.Tensor,
    logits_u: torch.Tensor,
    prior: float,
    prior_u: float | None = None,
    weights_u: torch.Tensor | None = None,
    logits_p_neg: torch.Tensor | None = None,
    p_neg_fraction: float | None = None,
) -> PURisk:
    """:func:`masked_pu_risk` of one network whose labelled-positive and unlabelled logits
    come as separate vectors (``weights_u``: one per unlabelled logit; ``logits_p_neg``: the
    correction term's labelled positives, None: ``logits_p``; empty: the term is zero)."""
    parts = [logits_p, logits_u] + ([] if logits_p_neg is None else [logits_p_neg])
    logits = torch.cat(parts)

    def rows(i: int, fill: torch.Tensor | None = None) -> torch.Tensor:
        """1 (or ``fill``) on the rows of ``parts[i]``, 0 elsewhere."""
        return torch.cat([torch.full((len(v),), float(j == i), dtype=logits.dtype,
                                     device=logits.device) if fill is None or j != i
                          else fill.to(logits.dtype) for j, v in enumerate(parts)])

    pos, unl = rows(0), rows(1)
    pos_neg = None if logits_p_neg is None else rows(2)
    if p_neg_fraction is not None and len(logits_p) == 0:
        p_neg_fraction = 0.0  # no labelled positive: the term is zero
    return masked_pu_risk(logits, pos, unl, prior, prior_u,
                          None if weights_u is None else rows(1, weights_u),
                          pos_neg, p_neg_fraction)


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


def naive_pn_loss(logits: torch.Tensor, s: torch.Tensor,
                  valid: torch.Tensor | None = None) -> torch.Tensor:
    """Treat unlabelled as negative: binary cross entropy against the PU label ``s``, the
    mean over the rows (``valid``: over the rows where it is 1, per network)."""
    if valid is None:
        return F.binary_cross_entropy_with_logits(logits, s.to(logits.dtype))
    each = F.binary_cross_entropy_with_logits(logits, s.to(logits.dtype), reduction="none")
    return masked_mean(each, valid)


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


# ---------------------------------------------------------------------- VPU


def variational_loss(logits: torch.Tensor, pos: torch.Tensor, marginal: torch.Tensor
                     ) -> torch.Tensor:
    """VPU's variational loss (Chen et al., NeurIPS 2020), one per network:

        log E_X[phi(x)] - E_P[log phi(x)],   phi = sigmoid(g)

    over the rows drawn from the training distribution (``marginal``) and the labelled
    positives (``pos``), as 0/1 masks along the last axis. It needs no class prior; the
    mean inside the log is a log-sum-exp of log phi (the term is zero where ``marginal``
    holds no row)."""
    log_phi = F.logsigmoid(logits)
    n = marginal.sum(-1)
    # the lowest finite number, not -inf: no NaN gradient where a mask holds no row
    log_sum = torch.logsumexp(log_phi.masked_fill(marginal == 0, torch.finfo(log_phi.dtype).min),
                              -1)
    log_mean = torch.where(n > 0, log_sum - torch.log(n.clamp(min=1)), torch.zeros_like(n))
    return log_mean - masked_mean(log_phi, pos)


def mixup_regulariser(logits: torch.Tensor, mixed: torch.Tensor,
                      lam: float | torch.Tensor, marginal: torch.Tensor) -> torch.Tensor:
    """VPU's MixUp consistency, one per network: the mean over the ``marginal`` rows of

        (log(lam phi(x) + (1 - lam)) - log phi(lam x + (1 - lam) x_p))^2

    where ``mixed`` holds the logits of the mixed inputs (each row mixed with a labelled
    positive x_p, whose target is 1) and ``lam`` is the batch's mixing weight (one per
    network of a stack). The target keeps its gradient, as in the paper's code."""
    if isinstance(lam, torch.Tensor) and lam.dim() > 0:
        lam = lam.unsqueeze(-1)
    lam_t = torch.as_tensor(lam, dtype=logits.dtype, device=logits.device)
    log_target = torch.logaddexp(torch.log(lam_t) + F.logsigmoid(logits),
                                 torch.log1p(-lam_t))
    return masked_mean((log_target - F.logsigmoid(mixed)) ** 2, marginal)
