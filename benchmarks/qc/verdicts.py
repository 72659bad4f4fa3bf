"""The calibration's maths: which checked metrics a case fails, how far the thresholds sit
from the worst good case and the nearest broken one, and the labels that depend on the
measured displacement."""

from __future__ import annotations

#: Metric -> (check direction, the setting that bounds it).
CHECKED = {
    "brain_volume_ml": ("range", "min_brain_ml/max_brain_ml"),
    "brain_fraction_of_head": ("high", "max_brain_fraction_of_head"),
    "mask_edge_contrast": ("high", "max_mask_edge_contrast"),
    "mask_edge_offset_mm": ("range", "min_mask_edge_offset_mm/max_mask_edge_offset_mm"),
    "brain_noise": ("high", "max_brain_noise"),
    "registration_similarity": ("low", "min_registration_similarity"),
    "template_mask_dice": ("low", "min_template_mask_dice"),
    "template_end_coverage": ("low", "min_template_end_coverage"),
    "registration_gain": ("high", "max_registration_gain"),
}



#: A perturbed transform is a broken case when it moves the template brain's points by
#: this much on average (mm), info below: labelled by displacement, not by angle, because
#: the same rotation moves a small brain less (the choice: docs/preprocessing.md).
MISREG_BROKEN_MM = 4.0

#: Broken cases that no check on the image can catch, and why.
KNOWN_LIMITS = {
    "header_flip_LR": "a left-right mirrored brain matches the symmetric MNI152 template as "
                      "well as the true one: only the scan's provenance can tell",
}


def _ranges(qc) -> dict[str, tuple[float, float]]:
    """The two-sided checks: metric -> (lowest, highest value accepted)."""
    return {"brain_volume_ml": (qc.min_brain_ml, qc.max_brain_ml),
            "mask_edge_offset_mm": (qc.min_mask_edge_offset_mm, qc.max_mask_edge_offset_mm)}


def _thresholds(qc) -> dict[str, float]:
    """The one-sided checks: metric -> its limit."""
    return {"brain_fraction_of_head": qc.max_brain_fraction_of_head,
            "mask_edge_contrast": qc.max_mask_edge_contrast,
            "brain_noise": qc.max_brain_noise,
            "registration_similarity": qc.min_registration_similarity,
            "template_mask_dice": qc.min_template_mask_dice,
            "template_end_coverage": qc.min_template_end_coverage,
            "registration_gain": qc.max_registration_gain}


def failed_metrics(metrics: dict, qc) -> list[str]:
    """Names of the checked metrics beyond their thresholds."""
    out = []
    for name, (lo, hi) in _ranges(qc).items():
        v = metrics.get(name)
        if v is not None and not lo <= v <= hi:
            out.append(name)
    for name, thr in _thresholds(qc).items():
        v = metrics.get(name)
        if v is not None and (v > thr if CHECKED[name][0] == "high" else v < thr):
            out.append(name)
    return out


def margins(records: list[dict], qc) -> dict:
    """Per checked metric: the worst good value, the threshold, and the nearest broken value
    it catches (broken cases caught by this metric only count), with the margins."""
    out = {}
    good = [r for r in records if r["label"] == "good"]
    broken = [r for r in records if r["label"] == "broken"]
    for name, (direction, _) in CHECKED.items():
        vals = [r["metrics"][name] for r in good if r["metrics"].get(name) is not None]
        if not vals:
            continue
        if direction == "range":
            entry = range_margins(name, vals, broken, *_ranges(qc)[name])
        else:
            thr = _thresholds(qc)[name]
            worst = max(vals) if direction == "high" else min(vals)
            bad = [r["metrics"][name] for r in broken if r["metrics"].get(name) is not None
                   and (r["metrics"][name] > thr if direction == "high"
                        else r["metrics"][name] < thr)]
            nearest = (min(bad) if direction == "high" else max(bad)) if bad else None
            sign = 1 if direction == "high" else -1
            # broken cases that only this metric catches: the margin that matters most
            sole = [(r["metrics"][name], r["case"]) for r in broken if r["failed"] == [name]]
            sole_v, sole_case = ((min(sole) if direction == "high" else max(sole))
                                 if sole else (None, None))
            entry = {"worst_good": worst, "threshold": thr, "nearest_caught_broken": nearest,
                     "margin_to_good": round(sign * (thr - worst), 4),
                     "margin_to_broken": (round(sign * (nearest - thr), 4)
                                          if nearest is not None else None),
                     "broken_caught": len(bad),
                     "nearest_broken_caught_only_by_it": sole_case,
                     "margin_to_it": (round(sign * (sole_v - thr), 4)
                                      if sole_v is not None else None)}
        out[name] = entry
    return out


def range_margins(name: str, good: list[float], broken: list[dict], lo: float,
                   hi: float) -> dict:
    """Margins of a two-sided check: to the good cases and to the nearest broken case it
    catches on each side (and the nearest that only it catches)."""
    entry = {"good_min": min(good), "good_max": max(good), "thresholds": [lo, hi],
             "margin_low": round(min(good) - lo, 4), "margin_high": round(hi - max(good), 4)}
    vals = [(r["metrics"][name], r["case"], r["failed"] == [name]) for r in broken
            if r["metrics"].get(name) is not None]
    below = [v for v in vals if v[0] < lo]
    above = [v for v in vals if v[0] > hi]
    entry["broken_caught"] = len(below) + len(above)
    for side, hits, pick, sign in (("low", below, max, -1), ("high", above, min, 1)):
        near = pick(hits) if hits else None
        sole = [v for v in hits if v[2]]
        sole = pick(sole) if sole else None
        thr = lo if side == "low" else hi
        entry[f"nearest_caught_broken_{side}"] = near[0] if near else None
        entry[f"margin_to_broken_{side}"] = (round(sign * (near[0] - thr), 4)
                                            if near else None)
        entry[f"nearest_broken_caught_only_by_it_{side}"] = sole[1] if sole else None
        entry[f"margin_to_it_{side}"] = round(sign * (sole[0] - thr), 4) if sole else None
    return entry



def summarise(records: list[dict]) -> dict:
    """The verdicts in numbers: good cases refused, broken cases passed (apart from the
    :data:`KNOWN_LIMITS`), and the counts."""
    good = [r for r in records if r["label"] == "good"]
    broken = [r for r in records if r["label"] == "broken"]
    passed = [r["case"] for r in broken if not r["problems"]]
    return {"good_rejected": [r["case"] for r in good if r["problems"]],
            "broken_passed": [c for c in passed if c not in KNOWN_LIMITS],
            "broken_passed_known_limits": {c: KNOWN_LIMITS[c] for c in passed
                                           if c in KNOWN_LIMITS},
            "n_good": len(good), "n_broken": len(broken),
            "n_broken_caught": len(broken) - len(passed),
            "heads": sorted({r.get("head", "colin27") for r in records})}


def rejudge(records: list[dict], qc) -> list[dict]:
    """The cases of an earlier run judged again with ``qc`` (their metrics as measured)."""
    from adni_pu.preprocessing.qc import qc_checks

    out = []
    for r in records:
        r = dict(r)
        r.setdefault("head", "template" if r["case"].startswith("template_") else "colin27")
        err = (r.get("truth") or {}).get("registration_error_mm")
        if ":misreg_" in r["case"] or r["case"].startswith("misreg_"):
            r["label"] = "broken" if err is not None and err >= MISREG_BROKEN_MM else "info"
        r["problems"] = qc_checks(r["metrics"], qc)
        r["failed"] = failed_metrics(r["metrics"], qc)
        out.append(r)
    return out

