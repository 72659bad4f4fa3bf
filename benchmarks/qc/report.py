"""The calibration's tables in Markdown: per head, per demo run, per case, and the margins
of every check."""

from __future__ import annotations


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3f}"
    return str(v)


def markdown(records: list[dict], margin: dict, synthetic: dict | None = None) -> str:
    cols = ["brain_volume_ml", "brain_fraction_of_head", "mask_edge_contrast",
            "mask_edge_offset_mm", "brain_noise",
            "registration_similarity", "template_mask_dice", "template_end_coverage",
            "registration_gain"]
    heads: dict[str, dict] = {}
    for r in records:
        e = heads.setdefault(r.get("head", "colin27"), {"good": 0, "good_refused": 0,
                                                         "broken": 0, "caught": 0})
        if r["label"] == "good":
            e["good"] += 1
            e["good_refused"] += bool(r["problems"])
        elif r["label"] == "broken":
            e["broken"] += 1
            e["caught"] += bool(r["problems"])
    lines = ["| head | good cases | good refused | broken copies | broken caught |",
             "|---|---|---|---|---|"]
    lines += [f"| {h} | {e['good']} | {e['good_refused']} | {e['broken']} | {e['caught']} |"
              for h, e in heads.items()]
    if synthetic:
        lines += ["", "| demo run (synthetic scans) | scans | refused now | rate | refused by "
                      "| refused when it ran |", "|---|---|---|---|---|---|"]
        for run, e in synthetic["per_run"].items():
            by = ", ".join(f"{k} {v}" for k, v in e["refused_by"].items()) or "-"
            lines.append(f"| {run} | {e['scans']} | {e['refused']} | "
                         f"{100 * e['false_refusal_rate']:.1f}% | {by} | "
                         f"{e['refused_in_run']} ({100 * e['false_refusal_rate_in_run']:.1f}%) |")
        a = synthetic["all"]
        lines.append(f"| all | {a['scans']} | {a['refused']} | "
                     f"{100 * a['false_refusal_rate']:.1f}% | | {a['refused_in_run']} "
                     f"({100 * a['false_refusal_rate_in_run']:.1f}%) |")
    head = ("| case | label | brain ml | brain/head | edge contrast | edge offset mm | noise | "
            "correlation | template Dice | end coverage | nudge gain | truth: mask Dice / "
            "reg. error mm | verdict |")
    lines += ["", head, "|" + "---|" * 13]
    for r in records:
        m = r["metrics"]
        truth = r.get("truth") or {}
        dice = truth.get("mask_dice_vs_reference", truth.get("mask_dice_vs_ch2bet"))
        t = f"{_fmt(dice)} / {_fmt(truth.get('registration_error_mm'))}" if truth else "-"
        verdict = "pass" if not r["problems"] else "**fail**: " + ", ".join(r["failed"])
        lines.append(f"| {r['case']} | {r['label']} | "
                     + " | ".join(_fmt(m.get(c)) for c in cols) + f" | {t} | {verdict} |")
    lines += ["", "| metric | worst good | threshold | worst synthetic | nearest broken it "
                  "catches | margin to good | margin to broken | nearest broken only it "
                  "catches (margin) |", "|---|---|---|---|---|---|---|---|"]
    worst = (synthetic or {}).get("worst", {})
    for name, e in margin.items():
        w = worst.get(name)
        w = f"{_fmt(w[0])} to {_fmt(w[1])}" if isinstance(w, list) else _fmt(w)
        if "thresholds" in e:
            lines.append(range_row(name, e, w))
        else:
            lines.append(f"| {name} | {_fmt(e['worst_good'])} | {e['threshold']} | {w} | "
                         f"{_fmt(e['nearest_caught_broken'])} | {_fmt(e['margin_to_good'])} | "
                         f"{_fmt(e['margin_to_broken'])} | "
                         + (f"{e['nearest_broken_caught_only_by_it']} ({_fmt(e['margin_to_it'])})"
                            if e["nearest_broken_caught_only_by_it"] else "-") + " |")
    return "\n".join(lines) + "\n"


def range_row(name: str, e: dict, worst_synthetic: str) -> str:
    """A two-sided check's line of the margins table (low side / high side)."""
    def pair(key: str) -> str:
        lo, hi = e.get(f"{key}_low"), e.get(f"{key}_high")
        return "-" if lo is None and hi is None else f"{_fmt(lo)} / {_fmt(hi)}"

    sole = [f"{e[f'nearest_broken_caught_only_by_it_{s}']} ({_fmt(e[f'margin_to_it_{s}'])})"
            for s in ("low", "high") if e.get(f"nearest_broken_caught_only_by_it_{s}")]
    lo, hi = e["thresholds"]
    return (f"| {name} | {_fmt(e['good_min'])} to {_fmt(e['good_max'])} | {_fmt(lo)} to "
            f"{_fmt(hi)} | {worst_synthetic} | {pair('nearest_caught_broken')} | "
            f"{_fmt(e['margin_low'])} / {_fmt(e['margin_high'])} | "
            f"{pair('margin_to_broken')} | {'; '.join(sole) or '-'} |")

