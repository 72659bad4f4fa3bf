"""The validation criteria a run is selected by: what each measures and how it is computed.

Their own module because the run view scores its validation split with them, the selection
rules (:mod:`adni_pu.pu.selection`) compare them, and reports name them; none of those
should import another to get them. No test number enters any of them.
"""

from __future__ import annotations

import numpy as np
import torch

from adni_pu.data.pu import PUSplit
from adni_pu.pu import losses
from adni_pu.pu.metrics import binary_metrics, roc_auc

LOWER_IS_BETTER = {"pu_risk": True, "pu_zero_one": True, "pu_auc": False, "variational": True,
                   "pn_accuracy": False}

#: What each validation criterion measures, in reports.
CRITERION_TEXT = {
    "pu_risk": "the unbiased PU risk of the validation split (uses the class prior)",
    "pu_zero_one": "the PU zero-one risk of the validation split (uses the class prior)",
    "pu_auc": "the AUC of the validation split's labelled positives against its unlabelled "
              "examples (needs no class prior; says nothing about the threshold)",
    "variational": "the variational PU loss of the validation split (needs no class prior)",
    "pn_accuracy": "the accuracy against the validation split's truth (pn_validation)",
}


def criterion_sentence(criterion: str, selection: str) -> str:
    """"on the validation split by `C`, what C measures; rule `R`": how a model was chosen,
    for reports and results tables."""
    what = CRITERION_TEXT.get(criterion)
    return (f"on the validation split by `{criterion}`" + (f", {what}" if what else "")
            + f"; rule `{selection}`")


def val_scores(logits: np.ndarray, val: PUSplit, scheme: str, prior: float, prior_u: float,
               pn_validation: bool = False) -> dict[str, float]:
    """PU validation criteria (and the PN accuracy with ``pn_validation``) from logits:
    the PU risk (needs the prior), its zero-one form, the P-vs-U AUC and VPU's variational
    loss (neither needs the prior)."""
    t = torch.from_numpy(logits)
    lab = torch.from_numpy(val.labelled)
    u = torch.from_numpy(val.unlabelled_indices(scheme))  # type: ignore[arg-type]
    risk = losses.pu_risk(t[lab], t[u], prior, prior_u)
    out = {
        "pu_risk": float(risk.unbiased),
        "pu_zero_one": losses.zero_one_pu_risk(t[lab], t[u], prior),
        "pu_auc": roc_auc(np.concatenate([logits[val.labelled], logits[u.numpy()]]),
                          np.concatenate([np.ones(int(val.labelled.sum())), np.zeros(len(u))])),
        # VPU's criterion, prior-free: every example of the split is drawn from its
        # distribution under either scheme
        "variational": float(losses.variational_loss(t, lab.float(), torch.ones_like(t))),
    }
    if pn_validation:
        out["pn_accuracy"] = binary_metrics(logits, val.truth)["accuracy"]
    return out


def pu_risks(loss_pos: np.ndarray, loss_neg: np.ndarray, p_mask: np.ndarray,
             u_mask: np.ndarray, prior: float, prior_u: float) -> np.ndarray:
    """The unbiased PU risk of many rows of logits at once, on the examples the masks select
    (for re-applying selection rules to recorded runs over many resamples).

    ``loss_pos`` / ``loss_neg``: sigmoid losses l(g, +1) / l(g, -1) per row and example; the
    formula is :func:`adni_pu.pu.losses.pu_risk`'s (tests check they agree)."""
    p = p_mask.astype(np.float64) / max(int(p_mask.sum()), 1)
    u = u_mask.astype(np.float64) / max(int(u_mask.sum()), 1)
    scale = (1.0 - prior) / (1.0 - prior_u)
    return prior * (loss_pos @ p) + scale * (loss_neg @ u - prior_u * (loss_neg @ p))
