"""Self-calibrated loss reweighting: learning-to-reweight (Ren et al. 2018) with one virtual step.

Every unlabelled example i outside the trusted set carries two weights: ``w_i1`` on its
entropy term L_CES (cross entropy of its prediction against itself, which sharpens it) and
``w_i2`` on its nnPU term l(g_i, -1). With all weights at zero, one virtual SGD step of size
``delta`` is taken through :func:`torch.func.functional_call` (no copy of the network, no
hand-written meta layers), the validation objective is evaluated at the virtual parameters,
and ``u = -d objective / d w`` at zero tells which examples' terms would lower it.

Normalisation (ours, documented): ``w~ = max(u, 0)``; each example's two weights are
rescaled to sum to one, ``a_i = w~_i1 / (w~_i1 + w~_i2)``, ``b_i = w~_i2 / (...)``, so the
batch's loss keeps the scale of plain nnPU and a weight says *how* an example is used, not
how much; an example with both weights zero falls back to pure nnPU (a=0, b=1). Then the
total entropy weight of the batch is capped at ``cap * batch_size`` (cap = 1/16): examples
are admitted by decreasing ``a_i`` and, once the cap is reached, the rest fall back to pure
nnPU.

``mode="mean-one"`` (SelfPUConfig.reweight_risk) changes two things so that the weights do
not bias the negative risk R_n low: an example whose two raw hypergradients are both tiny
(``|u| <= 1e-3 * max |u|`` over the batch) falls back to pure nnPU instead of letting the
sign of a near-zero number decide, and after the cap the nnPU weights ``b`` are rescaled to
mean one over the batch (``sum b = n``; all ones when the sum is zero), so the weighted
E_U[l(g, -1)] keeps the scale of the unweighted one. ``mode="shrink"`` is the rule above.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from adni_pu.pu.stack import Stack

ValidationObjective = Callable[[dict[str, torch.Tensor]], torch.Tensor]
WeightMode = Literal["shrink", "mean-one"]
BatchNormMode = Literal["batch", "running"]
TINY = 1e-3  # mean-one: |u| at or below TINY * max |u| over the batch counts as zero


@dataclass
class CalibrationWeights:
    """Per-example weights on the entropy term (``ce``) and the nnPU term (``pu``)."""

    ce: torch.Tensor
    pu: torch.Tensor
    raw: torch.Tensor  # u before clamping, shape 2 x n (2 x M x B for a stack)
    capped: torch.Tensor  # number of examples the cap sent back to pure nnPU (per network)

    def stats(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Batch statistics over the reweighted ``rows`` (0/1, the weights' shape), one per
        network: float64 tensors on the weights' device (no host sync); zero without rows."""
        n = rows.sum(-1).clamp(min=1).double()
        return {
            "ce_weight_mean": (self.ce * rows).sum(-1).double() / n,
            "ce_weight_nonzero": ((self.ce > 0) * rows).sum(-1).double() / n,
            "pu_weight_mean": (self.pu * rows).sum(-1).double() / n,
            "raw_positive_fraction": ((self.raw > 0) * rows).sum((0, -1)).double() / (2 * n),
            "capped_fraction": self.capped.double() / n,
        }


def virtual_parameters(model: nn.Module) -> tuple[list[str], list[torch.Tensor]]:
    """Names and tensors of the trainable parameters (the virtual step moves these)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [n for n, _ in named], [p for _, p in named]


def cloned_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the module's buffers, so a functional forward in train mode cannot change
    the real BatchNorm running statistics."""
    return {n: b.detach().clone() for n, b in model.named_buffers()}


def functional_forward(model: nn.Module, params: dict[str, torch.Tensor], x: object,
                       bn: BatchNormMode = "batch", valid: torch.Tensor | None = None
                       ) -> torch.Tensor:
    """Run ``model`` with ``params`` in place of its parameters and private buffer copies.

    ``bn="running"`` runs its BatchNorm layers in evaluation mode (normalised by the running
    statistics, not by this batch's) for the call, whatever the model's mode. ``valid``:
    a :class:`Stack`'s rows that are examples (the rest pad the batch; one network's batch
    has no padding, and ignores it)."""
    stacked = isinstance(model, Stack)
    source = model.skeleton if stacked else model
    norms = [] if bn == "batch" else [
        m for m in source.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    modes = [m.training for m in norms]
    try:
        for m in norms:
            m.eval()
        args = (x, valid) if stacked and valid is not None else (x,)
        return torch.func.functional_call(model, {**cloned_buffers(model), **params}, args)
    finally:
        for m, mode in zip(norms, modes):
            m.train(mode)


def hypergradient(
    model: nn.Module,
    entropy_terms: torch.Tensor,
    pu_terms: torch.Tensor,
    objective: ValidationObjective,
    step_size: float,
    sign_flip: bool = False,
    counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """``u = -d objective(theta - delta * grad L(theta, w)) / d w`` at ``w = 0`` (2 x n).

    ``entropy_terms`` and ``pu_terms`` are per-example losses that still hold their graph to
    the model's parameters. ``sign_flip`` reproduces the published code's defect (the
    entropy term enters the virtual loss with the opposite sign). With ``counts`` the terms
    are a whole batch's rows (B, or M x B for a :class:`Stack`) and ``counts`` (1, or M x 1)
    each network's number of reweighted rows, the virtual loss's divisor (the other rows'
    u are computed too, and ignored by the caller): the result is then 2 x B (2 x M x B).
    """
    shape = pu_terms.shape
    weights = torch.zeros(2, *shape, dtype=pu_terms.dtype, device=pu_terms.device,
                          requires_grad=True)
    sign = -1.0 if sign_flip else 1.0
    terms = weights[0] * sign * entropy_terms + weights[1] * pu_terms
    virtual_loss = (terms.sum() / max(pu_terms.numel(), 1) if counts is None
                    else (terms / counts.clamp(min=1)).sum())
    names, params = virtual_parameters(model)
    grads = torch.autograd.grad(virtual_loss, params, create_graph=True, retain_graph=True,
                                allow_unused=True)
    moved = {
        name: p if g is None else p - step_size * g
        for name, p, g in zip(names, params, grads)
    }
    value = objective(moved)
    (grad_w,) = torch.autograd.grad(value, weights, retain_graph=True, allow_unused=True)
    if grad_w is None:
        return torch.zeros(2, *shape, device=pu_terms.device)
    return -grad_w.detach()


TermsAt = Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]
"""params -> (entropy terms, nnPU terms) of the training batch's rest-U rows."""


def hypergradient_jvp(
    model: nn.Module,
    terms_at: TermsAt,
    objective: ValidationObjective,
    step_size: float,
    sign_flip: bool = False,
    counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """The hypergradient of :func:`hypergradient` by forward mode, without a second-order
    backward pass.

    At ``w = 0`` the virtual step leaves the parameters where they are, so
    ``d objective / d w_i = -(step / n) grad objective(theta) . grad term_i(theta)``. One
    backward pass gives ``v = grad objective(theta)``; one forward-mode pass of ``terms_at``
    (the batch's terms as a function of the parameters) along ``v`` gives every
    ``grad term_i . v`` at once. Equal to the double-backward result up to rounding.
    """
    names, params = virtual_parameters(model)
    value = objective(dict(zip(names, params)))
    grads = torch.autograd.grad(value, params, allow_unused=True)
    direction = tuple(torch.zeros_like(p) if g is None else g.detach()
                      for p, g in zip(params, grads))

    def terms(*flat: torch.Tensor) -> torch.Tensor:
        entropy_terms, pu_terms = terms_at(dict(zip(names, flat)))
        return torch.stack([entropy_terms, pu_terms])

    primals = tuple(p.detach() for p in params)
    _, tangent = torch.func.jvp(terms, primals, direction)
    if sign_flip:  # no tensor made from host values: the step stays replayable
        tangent = torch.stack([-tangent[0], tangent[1]])
    scale = (step_size / max(tangent.shape[1], 1) if counts is None
             else step_size / counts.clamp(min=1))
    return scale * tangent.detach()


def normalise_weights(raw: torch.Tensor, batch_size: int | torch.Tensor, cap: float,
                      mode: WeightMode = "shrink", mask: torch.Tensor | None = None
                      ) -> CalibrationWeights:
    """Clamp, per-example normalisation and the batch cap on the entropy weight (see module).

    ``raw`` is 2 x n; or a whole batch's 2 x B (2 x M x B for a stack of M models) with
    ``mask`` (B or M x B, 0/1) marking each model's reweighted rows (the others get ce = 0,
    pu = 1 and no say) and ``batch_size`` each model's rows (1, or M x 1)."""
    if mask is not None:
        raw = raw * mask
    w = torch.clamp(raw, min=0.0)
    total = w.sum(dim=0)
    has = total > 0
    if mode == "mean-one" and raw.numel():
        size = raw.abs()
        tiny = (size <= TINY * size.amax(dim=(0, -1), keepdim=True)).all(dim=0)
        has = has & ~tiny
    ce = torch.where(has, w[0] / torch.where(has, total, torch.ones_like(total)),
                     torch.zeros_like(total))
    pu = torch.where(has, 1.0 - ce, torch.ones_like(total))
    budget = cap * batch_size
    order = torch.argsort(ce, dim=-1, descending=True, stable=True)
    ranked = ce.gather(-1, order)
    over = torch.cumsum(ranked, -1) > budget + 1e-12
    # the capped examples as a mask in example order (a scatter: no data-dependent shape)
    capped = torch.zeros_like(has).scatter(-1, order, over & (ranked > 0))
    ce = ce.masked_fill(capped, 0.0)
    pu = pu.masked_fill(capped, 1.0)
    if mode == "mean-one":
        rows = pu if mask is None else pu * mask
        pu_sum = rows.sum(-1, keepdim=True)
        count = pu.shape[-1] if mask is None else mask.sum(-1, keepdim=True)
        ok = pu_sum > 0
        pu = torch.where(ok, pu * count / torch.where(ok, pu_sum, torch.ones_like(pu_sum)),
                         torch.ones_like(pu))
    return CalibrationWeights(ce, pu, raw, capped.sum(-1))


@dataclass(frozen=True)
class MetaStep:
    """The settings of the self-calibration step (``SelfPUConfig``'s ``meta_step_size``,
    ``meta_ce_cap``, ``meta_sign_flip`` and ``reweight_risk``): the virtual step's size,
    the cap on the batch's entropy weight, the hypergradient's sign convention and the
    weights' normalisation (:func:`normalise_weights`)."""

    step_size: float
    cap: float
    sign_flip: bool = False
    mode: WeightMode = "shrink"


def calibration_weights(
    model: nn.Module,
    entropy_terms: torch.Tensor,
    pu_terms: torch.Tensor,
    objective: ValidationObjective,
    settings: MetaStep,
    batch_size: int | torch.Tensor,
    terms_at: TermsAt | None = None,
    rows: torch.Tensor | None = None,
) -> CalibrationWeights:
    """The whole self-calibration step for one mini-batch (``settings``: :class:`MetaStep`);
    with ``terms_at`` (the terms as a function of the parameters) the hypergradient comes
    from :func:`hypergradient_jvp`.

    ``rows`` (0/1, the terms' shape: B, or M x B for a :class:`Stack`): the reweighted rows
    among the terms' (the virtual loss averages over them; the others get ce = 0, pu = 1);
    None: every term's row. ``batch_size``: the rows of the batch (per network, M x 1, for
    a stack), which the cap on the entropy weight scales with."""
    counts = None if rows is None else rows.sum(-1, keepdim=True)
    step_size, sign_flip = settings.step_size, settings.sign_flip
    if terms_at is not None:
        raw = hypergradient_jvp(model, terms_at, objective, step_size, sign_flip, counts)
    else:
        raw = hypergradient(model, entropy_terms, pu_terms, objective, step_size, sign_flip,
                            counts)
    return normalise_weights(raw, batch_size, settings.cap, settings.mode, rows)
