"""Model selection on the validation split: the criteria, the pool, the choice.

The one home of the rules that the trainer applies after every epoch and that the
benchmark scripts re-applied to recorded runs (``benchmarks/selection_rules.py`` and
``benchmarks/val_summary.py``, in git at d825906):

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
from torch import nn

from adni_pu.pu.candidates import AveragedModel, candidate_state
from adni_pu.pu.criteria import LOWER_IS_BETTER
from adni_pu.pu.metrics import average_logits, binary_metrics
from adni_pu.pu.run import Network, RunView, role_of


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
    :class:`~adni_pu.pu.candidates.AveragedModel` of the live candidates); for diagnostics."""
    pool_now = {n.name: n.module for n in candidates(run.state.networks())}
    return {name: (AveragedModel(list(pool_now.values())) if name == "average"
                   else pool_now[name]).eval()
            for name in finalists(list(pool_now), run.cfg.selfpu.final_model)}


def evaluate_epoch(run: RunView, epoch: int) -> dict[str, Any]:
    """After ``epoch``: the validation criteria of every network of ``run`` (and the test
    accuracy, as a diagnostic only, never used), and the update of the run state's ``best``
    and ``final`` (:func:`judge_epoch`)."""
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
