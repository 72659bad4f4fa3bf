"""Classification metrics from logits and true labels, PU validation criteria, bootstrap CIs."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Probability from a logit (the array's dtype is kept)."""
    return 1.0 / (1.0 + np.exp(-np.asarray(x)))


def logit(p: np.ndarray, eps: float = 1e-7) -> np.ndarray:
    """Logit of a probability, clipped to [eps, 1 - eps] so 0 and 1 stay finite."""
    p = np.clip(p, eps, 1 - eps)
    return np.log(p / (1 - p))


def average_logits(logits: list[np.ndarray]) -> np.ndarray:
    """Logit of the mean probability of several models (the teachers' average)."""
    return logit(np.mean([sigmoid(lg) for lg in logits], axis=0))


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney, ties counted half); nan with one class."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels).astype(bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    from scipy.stats import rankdata

    ranks = rankdata(scores)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


#: The PU task's own metrics (:func:`binary_metrics` with ``pu_label``).
PU_METRICS: tuple[str, ...] = ("hidden_positive_recall", "hidden_auc",
                               "all_negative_accuracy", "all_positive_accuracy")
#: The columns of a PU results table (demo report, paper-scale benchmark): accuracy, the
#: paper's number, first.
TABLE_METRICS: tuple[str, ...] = ("accuracy", "auc", "balanced_accuracy",
                                  "hidden_positive_recall", "hidden_auc", "sensitivity",
                                  "specificity")
#: How a metric is named in a table (others: the key with spaces for underscores).
METRIC_LABELS: dict[str, str] = {"auc": "AUC", "balanced_accuracy": "balanced accuracy",
                                 "hidden_positive_recall": "hidden-positive recall",
                                 "hidden_auc": "hidden AUC"}


def metric_label(name: str) -> str:
    """The table name of a metric: :data:`METRIC_LABELS`, else underscores as spaces."""
    return METRIC_LABELS.get(name, name.replace("_", " "))


def binary_metrics(logits: np.ndarray, truth: np.ndarray,
                   pu_label: np.ndarray | None = None) -> dict[str, float]:
    """Accuracy, balanced accuracy, AUC, precision, recall (sensitivity), specificity, F1.

    Examples whose truth is unknown (nan) are left out; ``n`` says how many were scored.
    With ``pu_label`` (1 labelled positive, 0 unlabelled) the PU task's metrics too:

    - ``hidden_positive_recall``: share of the unlabelled set's true positives (the hidden
      positives) called positive (logit > 0), what naive training misses;
    - ``hidden_auc``: AUC of the hidden positives against the unlabelled negatives, its
      threshold-free counterpart;
    - ``all_negative_accuracy`` / ``all_positive_accuracy``: the accuracy of calling every
      example negative / positive, the reference lines of accuracy;
    - ``n_hidden``: how many hidden positives were scored.
    """
    logits = np.asarray(logits, dtype=np.float64)
    truth = np.asarray(truth, dtype=np.float64)
    known = ~np.isnan(truth)
    logits, y = logits[known], truth[known].astype(bool)
    extra: dict[str, float] = {}
    if pu_label is not None:
        unlabelled = np.asarray(pu_label, dtype=np.float64)[known] == 0
        hidden = unlabelled & y
        extra = {
            "hidden_positive_recall": float((logits[hidden] > 0).mean()) if hidden.any()
            else float("nan"),
            "hidden_auc": roc_auc(logits[unlabelled], y[unlabelled]),
            "all_negative_accuracy": float((~y).mean()) if len(y) else float("nan"),
            "all_positive_accuracy": float(y.mean()) if len(y) else float("nan"),
            "n_hidden": float(hidden.sum()),
        }
    pred = logits > 0
    tp = int((pred & y).sum())
    tn = int((~pred & ~y).sum())
    fp = int((pred & ~y).sum())
    fn = int((~pred & y).sum())
    n = len(y)

    def div(a: float, b: float) -> float:
        return a / b if b else float("nan")

    recall = div(tp, tp + fn)
    specificity = div(tn, tn + fp)
    precision = div(tp, tp + fp)
    f1 = div(2 * precision * recall, precision + recall) if not (
        math.isnan(precision) or math.isnan(recall)) else float("nan")
    return {
        "accuracy": div(tp + tn, n),
        "balanced_accuracy": (recall + specificity) / 2,
        "auc": roc_auc(logits, y),
        "precision": precision,
        "recall": recall,
        "sensitivity": recall,
        "specificity": specificity,
        "f1": f1,
        "n": float(n),
        "n_unknown": float((~known).sum()),
        **extra,
    }


def bootstrap_ci(
    logits: np.ndarray,
    truth: np.ndarray,
    metrics: tuple[str, ...] = ("accuracy", "balanced_accuracy", "auc", "sensitivity",
                                "specificity"),
    n_boot: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    groups: np.ndarray | None = None,
    pu_label: np.ndarray | None = None,
) -> dict[str, dict[str, float]]:
    """Point estimate and percentile bootstrap CI of each metric.

    With ``groups`` (e.g. subject ids) whole groups are resampled, so several scans of one
    subject do not narrow the interval. ``pu_label`` adds the PU task's metrics
    (:data:`PU_METRICS`, see :func:`binary_metrics`) to those that may be asked for.
    """
    logits = np.asarray(logits, dtype=np.float64)
    truth = np.asarray(truth, dtype=np.float64)
    known = ~np.isnan(truth)
    logits, truth = logits[known], truth[known]
    pu = None if pu_label is None else np.asarray(pu_label, dtype=np.float64)[known]
    point = binary_metrics(logits, truth, pu)
    rng = np.random.default_rng(seed)
    if groups is not None:
        groups = np.asarray(groups)[known]
        uniq, inverse = np.unique(groups, return_inverse=True)
        members = [np.flatnonzero(inverse == g) for g in range(len(uniq))]
    samples: dict[str, list[float]] = {m: [] for m in metrics}
    n = len(truth)
    for _ in range(n_boot if n else 0):
        if groups is not None:
            pick = rng.integers(0, len(members), len(members))
            idx = np.concatenate([members[g] for g in pick])
        else:
            idx = rng.integers(0, n, n)
        values = binary_metrics(logits[idx], truth[idx], None if pu is None else pu[idx])
        for m in metrics:
            samples[m].append(values[m])
    lo, hi = (1 - level) / 2 * 100, (1 + level) / 2 * 100
    out = {}
    for m in metrics:
        arr = np.asarray(samples[m], dtype=np.float64)
        arr = arr[~np.isnan(arr)]
        out[m] = {
            "value": point[m],
            "ci_low": float(np.percentile(arr, lo)) if arr.size else float("nan"),
            "ci_high": float(np.percentile(arr, hi)) if arr.size else float("nan"),
        }
    return out


def paired_bootstrap(sizes: list[int], statistic: Callable[[list[tuple[int, np.ndarray]]], float],
                     n_boot: int = 1000, seed: int = 0, level: float = 0.95
                     ) -> dict[str, float]:
    """Percentile CI of a paired statistic by a two-level bootstrap: groups (seeds), then
    members (subjects, test examples) within each drawn group.

    ``sizes``: members per group. ``statistic`` gets ``[(group, member indices), ...]``, one
    pair per drawn group, and computes both methods' numbers on the same draw (paired);
    the point value is the statistic on every group with all its members. Resamples whose
    statistic is nan (e.g. one class only) are left out. Returns ``value, ci_low, ci_high``
    and the share of resamples above 0.
    """
    return paired_bootstrap_many(sizes, lambda picks: {"": statistic(picks)}, n_boot, seed,
                                 level)[""]


def paired_bootstrap_many(sizes: list[int],
                          statistics: Callable[[list[tuple[int, np.ndarray]]], dict[str, float]],
                          n_boot: int = 1000, seed: int = 0, level: float = 0.95
                          ) -> dict[str, dict[str, float]]:
    """:func:`paired_bootstrap` of several statistics on the same draws at once
    (``statistics`` returns a value per name): each name's result equals a
    :func:`paired_bootstrap` of that statistic alone, since the draws depend on the seed
    only, and a draw's shared work (e.g. every metric of one prediction set) is done once."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n_boot):
        drawn = rng.integers(0, len(sizes), len(sizes))
        samples.append(statistics([(int(g), rng.integers(0, sizes[g], sizes[g]))
                                   for g in drawn]))
    point = statistics([(g, np.arange(n)) for g, n in enumerate(sizes)])
    lo, hi = (1 - level) / 2 * 100, (1 + level) / 2 * 100
    out = {}
    for name, value in point.items():
        arr = np.asarray([s[name] for s in samples], dtype=np.float64)
        arr = arr[~np.isnan(arr)]
        out[name] = {"value": float(value),
                     "ci_low": float(np.percentile(arr, lo)) if arr.size else float("nan"),
                     "ci_high": float(np.percentile(arr, hi)) if arr.size else float("nan"),
                     "share_a_better": float((arr > 0).mean()) if arr.size else float("nan")}
    return out


def summarise(values: list[float]) -> dict[str, float]:
    """Mean, sample standard deviation and count (the form of the benchmark files)."""
    arr = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if arr.size == 0:
        return {"mean": float("nan"), "std": float("nan"), "n": 0}
    std = float(arr.std(ddof=1)) if arr.size > 1 else 0.0
    return {"mean": float(arr.mean()), "std": std, "n": int(arr.size)}


def percent_summary(values: list[float | None]) -> dict[str, float]:
    """:func:`summarise` of fractions as percent (None values left out)."""
    return summarise([100.0 * v for v in values if v is not None])


def mean_std(d: dict[str, float] | None, digits: int = 2) -> str:
    """``73.27 (0.39)`` from a :func:`summarise` entry; ``(one seed)`` without a spread,
    ``n/a`` when empty: the one formatter of the results tables."""
    if not d or d["n"] == 0:
        return "n/a"
    if d["n"] == 1:  # one seed: no standard deviation
        return f"{d['mean']:.{digits}f} (one seed)"
    return f"{d['mean']:.{digits}f} ({d['std']:.{digits}f})"


def format_ci(entry: dict[str, float]) -> str:
    """``0.812 [0.701, 0.903]`` (``n/a`` where undefined)."""
    def f(v: float | None) -> str:
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"

    return f"{f(entry['value'])} [{f(entry['ci_low'])}, {f(entry['ci_high'])}]"


def roc_curve(scores: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """False- and true-positive rates at every threshold (unknown truth left out)."""
    scores = np.asarray(scores, dtype=float)
    truth = np.asarray(truth, dtype=float)
    keep = ~np.isnan(truth)
    scores, y = scores[keep], truth[keep].astype(bool)
    order = np.argsort(-scores, kind="stable")
    scores, y = scores[order], y[order]
    distinct = np.r_[np.flatnonzero(np.diff(scores)), len(y) - 1] if len(y) else np.array([], int)
    tps = np.cumsum(y)[distinct] if len(y) else np.zeros(0)
    fps = (distinct + 1 - tps) if len(y) else np.zeros(0)
    n_pos, n_neg = max(int(y.sum()), 1), max(int((~y).sum()), 1)
    return np.r_[0.0, fps / n_neg], np.r_[0.0, tps / n_pos]
