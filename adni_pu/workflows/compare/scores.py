"""Pooled held-out scores of a comparison: per method, per seed, with CIs over seeds and
subjects; the fixed test set's; calibration against the truth.

Every subject is scored once per seed, by the fold model that held it out; one method's
predictions of one seed are pooled over the folds. Each metric's value is the mean over
seeds of the pooled metric, its 95 % CI a two-level bootstrap (seeds, then subjects within
each drawn seed: :func:`adni_pu.pu.metrics.paired_bootstrap`, which with one seed is the
subject bootstrap); paired differences are :func:`paired_difference`, the one paired difference of the
project.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from adni_pu.pu.metrics import binary_metrics, paired_bootstrap, summarise

#: The report's metrics (against the truth; the last two: the PU task's).
METRICS: tuple[str, ...] = ("accuracy", "balanced_accuracy", "auc", "sensitivity",
                            "specificity", "hidden_positive_recall", "hidden_auc")
#: The metrics of the paired differences (the last: the PU task's, how many of the
#: positives hidden in the unlabelled set each method finds).
PAIRED_METRICS: tuple[str, ...] = ("accuracy", "balanced_accuracy", "auc",
                                   "hidden_positive_recall")
#: Bins of the reliability diagram and the expected calibration error.
CALIBRATION_BINS = 10


def seed_groups(frame: Any) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per seed (sorted): logits, truth and PU labels of its subjects with known truth."""
    out = []
    for _, g in frame[frame["truth"].notna()].groupby("seed", sort=True):
        out.append((g["logit"].to_numpy(float), g["truth"].to_numpy(float),
                    g["pu_label"].to_numpy(float)))
    return out


def method_scores(frame: Any, n_boot: int, seed: int = 0) -> dict[str, Any]:
    """Pooled metrics of one method (``seed, subject_id, logit, truth, pu_label``, one row
    per subject and seed): per metric the mean over seeds with a CI over seeds and subjects,
    and the mean (std) over seeds."""
    twice = frame.duplicated(["seed", "subject_id"])
    if twice.any():
        raise ValueError(f"subject {frame.loc[twice, 'subject_id'].iloc[0]} scored twice in "
                         "one seed (each subject is scored by the fold that held it out)")
    groups = seed_groups(frame)
    out: dict[str, Any] = {"n_subjects": int(frame["subject_id"].nunique()),
                           "n_seeds": len(groups),
                           "n_scored": int(len(groups[0][1])) if groups else 0,
                           "metrics": {}}
    if not groups:
        return out
    per_seed = [binary_metrics(lg, t, pu) for lg, t, pu in groups]
    out["n_hidden"] = int(per_seed[0]["n_hidden"])
    drawn: list[list[dict[str, float]]] = []

    def record(picks: list[tuple[int, np.ndarray]]) -> float:
        """Every metric of one draw at once (the draws do not depend on the metric)."""
        drawn.append([binary_metrics(*(a[idx] for a in groups[g])) for g, idx in picks])
        return 0.0

    paired_bootstrap([len(g[1]) for g in groups], record, n_boot, seed)
    resamples = drawn[:n_boot]  # the last call is paired_bootstrap's own point value
    for metric in METRICS:
        values = np.asarray([_mean([d[metric] for d in draw]) for draw in resamples], float)
        values = values[~np.isnan(values)]
        out["metrics"][metric] = {
            "value": _mean([s[metric] for s in per_seed]),
            "ci_low": float(np.percentile(values, 2.5)) if values.size else float("nan"),
            "ci_high": float(np.percentile(values, 97.5)) if values.size else float("nan"),
            "over_seeds": summarise([s[metric] for s in per_seed])}
    for name in ("all_negative_accuracy", "all_positive_accuracy"):
        out[name] = per_seed[0][name]
    return out


def _mean(values: list[float]) -> float:
    """Mean of the values that are defined (nan when none is: one class only)."""
    kept = [v for v in values if not np.isnan(v)]
    return float(np.mean(kept)) if kept else float("nan")


def paired_scores(frames: dict[str, Any], pairs: list[tuple[str, str]], n_boot: int
                  ) -> list[dict[str, Any]]:
    """Each pair's differences (A minus B) of :data:`PAIRED_METRICS`, paired over seeds
    and subjects; pairs over the same seeds share one bootstrap (:func:`paired_comparisons`)."""
    todo = [(a, b) for a, b in pairs if a in frames and b in frames]
    by_seeds: dict[tuple[int, ...], list[tuple[str, str]]] = {}
    for a, b in todo:
        seeds = tuple(sorted(set(frames[a]["seed"]) & set(frames[b]["seed"])))
        by_seeds.setdefault(seeds, []).append((a, b))
    results: dict[tuple[str, str], dict[str, Any]] = {}
    for seeds, group in by_seeds.items():
        names = list(dict.fromkeys(m for pair in group for m in pair))
        results.update(paired_comparisons(
            {m: frames[m][frames[m]["seed"].isin(seeds)] for m in names}, group,
            PAIRED_METRICS, n_boot=n_boot))
    return [{"pair": f"{a} - {b}", "a": a, "b": b,
             "seeds": sorted(set(frames[a]["seed"]) & set(frames[b]["seed"])),
             "metrics": results[(a, b)]} for a, b in todo]


def calibration(probability: np.ndarray, truth: np.ndarray, bins: int = CALIBRATION_BINS
                ) -> dict[str, Any]:
    """Reliability of probabilities against the truth: per equal-width bin the mean
    probability, the positive fraction and the count, and the expected calibration error
    (the count-weighted mean absolute gap; unknown truth left out)."""
    probability = np.asarray(probability, float)
    truth = np.asarray(truth, float)
    known = ~np.isnan(truth)
    p, y = probability[known], truth[known]
    which = np.clip((p * bins).astype(int), 0, bins - 1)
    rows, ece = [], 0.0
    for b in range(bins):
        inside = which == b
        if not inside.any():
            continue
        mean_p, frac = float(p[inside].mean()), float(y[inside].mean())
        rows.append({"bin": b, "mean_probability": mean_p, "positive_fraction": frac,
                     "n": int(inside.sum())})
        ece += inside.sum() / len(p) * abs(mean_p - frac)
    return {"ece": float(ece) if len(p) else float("nan"), "bins": rows, "n": int(len(p))}


def ensemble_test(frame: Any) -> Any:
    """The fixed test set's per-subject predictions of a method's fold models, averaged
    (probability mean over folds and seeds), with ``spread`` the standard deviation."""
    from adni_pu.pu.metrics import logit

    out = frame.groupby("subject_id", sort=True).agg(
        probability=("probability", "mean"), spread=("probability", "std"),
        pu_label=("pu_label", "first"), truth=("truth", "first")).reset_index()
    out["logit"] = logit(out["probability"].to_numpy())
    return out.assign(seed=0)


def paired_difference(a: Any, b: Any, n_boot: int = 1000, seed: int = 0,
                      level: float = 0.95, metric: str = "auc") -> dict[str, Any]:
    """``metric`` (AUC by default; ``accuracy``, or a PU metric when both frames carry
    ``pu_label``) of ``a`` minus that of ``b`` on the same subjects, with a paired
    bootstrap CI.

    ``a`` and ``b``: per-subject predictions (``subject_id, logit, truth`` and optionally
    ``seed``, one row per subject and seed). Subjects with unknown truth are left out and
    both must score the same subjects. The bootstrap resamples seeds, then subjects within
    each drawn seed, and takes the same draw for both methods (paired); the difference is
    the mean over seeds of the per-seed AUC difference. Returns ``value, ci_low, ci_high``,
    the share of resamples where ``a`` is better, and the counts.
    """
    return paired_differences(a, b, (metric,), n_boot, seed, level)[metric]


def paired_differences(a: Any, b: Any, metrics: tuple[str, ...], n_boot: int = 1000,
                       seed: int = 0, level: float = 0.95) -> dict[str, dict[str, Any]]:
    """:func:`paired_difference` of several metrics from one bootstrap (each metric's
    result equals its own :func:`paired_difference`: the draws depend on ``seed`` only),
    so every draw's metrics are computed once."""
    return paired_comparisons({"a": a, "b": b}, [("a", "b")], metrics, n_boot, seed,
                              level)[("a", "b")]


def paired_comparisons(frames: dict[str, Any], pairs: list[tuple[str, str]],
                       metrics: tuple[str, ...], n_boot: int = 1000, seed: int = 0,
                       level: float = 0.95) -> dict[tuple[str, str], dict[str, Any]]:
    """Paired differences of several methods scored on the same subjects and seeds, every
    pair from one bootstrap: each (pair, metric) equals its own :func:`paired_difference`
    (the draws depend on ``seed`` and the subjects per seed only), and a draw's metrics of
    a method are computed once however many pairs it is in. The PU labels (for the PU
    metrics) are the first method's, where its frame has them."""
    from adni_pu.pu.metrics import binary_metrics, paired_bootstrap_many

    keys = ["seed", "subject_id"]
    names = list(frames)
    first = frames[names[0]].assign(seed=frames[names[0]].get("seed", 0))
    extra = ["pu_label"] if "pu_label" in first else []
    both = first[keys + ["logit", "truth"] + extra].rename(columns={"logit": names[0]})
    for name in names[1:]:
        other = frames[name].assign(seed=frames[name].get("seed", 0))
        both = both.merge(other[keys + ["logit"]].rename(columns={"logit": name}), on=keys,
                          how="outer", indicator=True)
        if (both["_merge"] != "both").any():
            odd = both.loc[both["_merge"] != "both", "subject_id"].iloc[0]
            raise ValueError(f"paired difference: subject {odd} is scored by one method only")
        both = both.drop(columns="_merge")
    both = both[both["truth"].notna()].sort_values(keys)
    if not extra:
        both = both.assign(pu_label=np.nan)
    groups = [({m: g[m].to_numpy(float) for m in names}, g["truth"].to_numpy(float),
               g["pu_label"].to_numpy(float)) for _, g in both.groupby("seed", sort=True)]
    used = list(dict.fromkeys(m for pair in pairs for m in pair))

    def diff(picks: list[tuple[int, np.ndarray]]) -> dict[str, float]:
        values: dict[str, list[float]] = {f"{a}|{b}|{k}": [] for a, b in pairs for k in metrics}
        for g, idx in picks:
            logits, truth, pu = groups[g]
            pu_drawn = pu[idx] if extra else None
            scores = {m: binary_metrics(logits[m][idx], truth[idx], pu_drawn) for m in used}
            for a, b in pairs:
                for k in metrics:
                    values[f"{a}|{b}|{k}"].append(scores[a][k] - scores[b][k])
        # a resample with one class only gives nan: left out of the mean over seeds
        kept = {key: [v for v in vs if not np.isnan(v)] for key, vs in values.items()}
        return {key: float(np.mean(vs)) if vs else float("nan") for key, vs in kept.items()}

    out = paired_bootstrap_many([len(g[1]) for g in groups], diff, n_boot, seed, level)
    return {(a, b): {k: {**out[f"{a}|{b}|{k}"], "metric": k, "n_subjects": int(len(both)),
                         "n_seeds": len(groups), "resamples": n_boot} for k in metrics}
            for a, b in pairs}
