"""Model selection on the validation split: the criteria, the pool, the choice.

The one home of the rules that the trainer applies after every epoch and that the
benchmark scripts re-apply to recorded runs (``benchmarks/selection_rules.py``,
``benchmarks/val_summary.py``):

- the criteria (:func:`val_scores`, :data:`LOWER_IS_BETTER`);
- the candidates (:func:`candidates`, by each network's role: the teachers once they exist,
  else the students, else the one model), the pool that competes at an epoch (:func:`pool`;
  only the teachers' average with ``final_model = "average"``) and the finalists after the
  last epoch (:func:`finalists`);
- the choice (:func:`choose`: the best score, ties broken by name, NaN only when all are);
- :func:`judge_epoch`: one epoch's validation row and what it changes in the selection
  (``selection = "best_epoch"``: the best score over every epoch; ``"final"``: the
  finalists' choice after the last epoch); :func:`evaluate_epoch` applies it to the
  run after every epoch.

No test number enters any of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from adni_pu.data.pu import PUSplit
from adni_pu.pu import losses
from adni_pu.pu.metrics import average_logits, binary_metrics, roc_auc
from adni_pu.pu.run import Network, RunView, role_of

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


def choose(scores: dict[str, float], lower: bool) -> str:
    """The best-scoring name (ties broken by name; a NaN score only when all are NaN)."""
    finite = [p for p in scores if not math.isnan(scores[p])] or list(scores)
    return (min if lower else max)(finite, key=lambda p: (scores[p], p))


def candidates(networks: list[Network]) -> list[Network]:
    """The networks that compete for selection now: the teachers once they exist, else the
    students (or the one model)."""
    teachers = [n for n in networks if n.role == "teacher"]
    return teachers or [n for n in networks if n.role != "average"]


def candidates_among(names: list[str]) -> list[str]:
    """:func:`candidates` among recorded network names (metrics.csv columns, saved logits),
    their roles read by :func:`adni_pu.pu.run.role_of`."""
    teachers = [n for n in names if role_of(n) == "teacher"]
    return teachers or [n for n in names if role_of(n) != "average"]


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


def _teachers_average_only(candidates: list[str], final_model: str) -> bool:
    """``final_model = "average"`` with the two teachers: only their average competes."""
    return (final_model == "average" and len(candidates) == 2
            and role_of(candidates[0]) == "teacher")


def finalists(candidates: list[str], final_model: str) -> list[str]:
    """The models that compete after the last epoch: the candidates and, when there are
    two, their average (only the teachers' average with ``final_model = "average"``)."""
    if _teachers_average_only(candidates, final_model):
        return ["average"]
    return [*candidates, "average"] if len(candidates) == 2 else list(candidates)


def pool(candidates: list[str], final_model: str, selection: str) -> list[str]:
    """The models whose scores compete at an epoch under ``selection``."""
    if selection == "final":
        return finalists(candidates, final_model)
    return ["average"] if _teachers_average_only(candidates, final_model) else list(candidates)


@dataclass
class EpochJudgement:
    """What one epoch's validation says: its ``val/`` metrics, the logits by model (the
    average included where it competes every epoch), the chosen name and score, and, after
    the last epoch, the finalists' record and whether this epoch's choice becomes the
    selection."""

    row: dict[str, Any]
    val_logits: dict[str, np.ndarray]
    choice: str
    score: float
    final: dict[str, Any] | None
    selected: bool


def judge_epoch(val_logits: dict[str, np.ndarray], candidates: list[str], *, last: bool,
                best_score: float | None, selection: str, final_model: str, criterion: str,
                scores_of: Callable[[np.ndarray], dict[str, float]]) -> EpochJudgement:
    """Score every model's validation logits and apply the selection rule.

    ``val_logits`` holds every model trained now (students and teachers), ``candidates``
    the names that may be chosen (:func:`pool` narrows them), ``best_score`` the best so
    far under ``"best_epoch"`` (None before the first), ``scores_of`` the criteria of
    :func:`val_scores` bound to the validation split.
    """
    row: dict[str, Any] = {}
    val_logits = dict(val_logits)
    finals = finalists(candidates, final_model)
    competing = pool(candidates, final_model, selection)
    average = (average_logits([val_logits[p] for p in candidates])
               if "average" in competing or (last and "average" in finals) else None)
    if "average" in competing:  # a column of metrics.csv only where it competes every epoch
        val_logits["average"] = average
    for name, logits in val_logits.items():
        for key, value in scores_of(logits).items():
            row[f"val/{name}/{key}"] = value
    lower = LOWER_IS_BETTER[criterion]
    scores = {p: row[f"val/{p}/{criterion}"] for p in competing}
    choice = choose(scores, lower)
    final = None
    if last:
        final_scores = {p: row[f"val/{p}/{criterion}"] if p in val_logits
                        else scores_of(average)[criterion] for p in finals}
        final = {"choice": choose(final_scores, lower), "val_scores": final_scores}
    score = scores[choice]
    if selection == "final":
        selected = last
    else:
        selected = not math.isnan(score) and (
            best_score is None or (score < best_score if lower else score > best_score))
    return EpochJudgement(row, val_logits, choice, score, final, selected)


def finalist_models(run: RunView) -> dict[str, nn.Module]:
    """The finalists of ``run`` now as modules in evaluation mode (the average as an
    :class:`~adni_pu.pu.checkpoint.AveragedModel` of the live candidates); for diagnostics."""
    from adni_pu.pu.checkpoint import AveragedModel

    pool_now = {n.name: n.module for n in candidates(run.state.networks())}
    return {name: (AveragedModel(list(pool_now.values())) if name == "average"
                   else pool_now[name]).eval()
            for name in finalists(list(pool_now), run.cfg.selfpu.final_model)}


def evaluate_epoch(run: RunView, epoch: int) -> dict[str, Any]:
    """After ``epoch``: the validation criteria of every network of ``run`` (and the test
    accuracy, as a diagnostic only, never used), and the update of the run state's ``best``
    and ``final`` (:func:`judge_epoch`)."""
    from adni_pu.pu.checkpoint import candidate_state

    cfg, state = run.cfg, run.state
    models = {n.name: n.module for n in state.networks()}
    pool_now = {n.name: n.module for n in candidates(state.networks())}
    judged = judge_epoch(
        {name: run.predict_logits(m, run.data.val) for name, m in models.items()},
        list(pool_now), last=epoch == cfg.epochs - 1,
        best_score=state.best["score"], selection=cfg.selection,
        final_model=cfg.selfpu.final_model, criterion=cfg.val_criterion,
        scores_of=run.val_scores)
    state.last_val_logits = judged.val_logits
    row = judged.row
    if len(state.students) == 2:
        a, b = (judged.val_logits[st.name] > 0 for st in state.students)
        row["val/student_agreement"] = float((a == b).mean())
    if cfg.track_test:
        for name, m in models.items():
            logits = run.predict_logits(m, run.data.test)
            row[f"test_diagnostic/{name}/accuracy"] = binary_metrics(
                logits, run.data.test.truth)["accuracy"]
    row["selected/candidate"] = judged.choice
    row["selected/score"] = judged.score
    if judged.final is not None:
        state.final = {"epoch": epoch, **judged.final}  # type: ignore[typeddict-item]
    if judged.selected:
        state.best = {"score": judged.score, "epoch": epoch, "candidate": judged.choice,
                      "state": candidate_state(models, pool_now, judged.choice)}
    return row
