"""A demo run's fingerprint, and how two differ: is a rerun of ``adni-pu demo`` the same run?

The fingerprint of a ``demo.json`` is, per method, every held-out subject's logit and the
pooled metrics. Two runs of the same code and settings agree to about 1e-6 in the logits
across CPUs; a change to the generator, preprocessing, the cohort or training moves them
far more. The project records the fingerprint of a reduced demo
(``benchmarks/results/demo-guard.json``) so that its test suite sees when the committed
demo numbers no longer are the code's.
"""

from __future__ import annotations

from typing import Any

#: How far a held-out subject's logit may move before two runs count as different.
LOGIT_ATOL = 1e-3
#: Pooled metrics kept beside the logits (compared only through the logits).
METRICS = ("accuracy", "auc", "hidden_positive_recall")


def fingerprint(record: dict[str, Any]) -> dict[str, Any]:
    """Per method: each held-out subject's logit and the pooled metrics of a ``demo.json``."""
    return {method: {
        "logits": {p["subject_id"]: p["logit"] for p in sorted(
            result["predictions"], key=lambda p: p["subject_id"])},
        "metrics": {m: result["pooled"]["metrics"][m]["value"] for m in METRICS}}
        for method, result in sorted(record["results"].items())}


def differences(expected: dict[str, Any], got: dict[str, Any],
                atol: float = LOGIT_ATOL) -> list[str]:
    """What differs between two fingerprints beyond ``atol``, one line each (empty: same)."""
    lines: list[str] = []
    if sorted(expected) != sorted(got):
        return [f"methods: expected {sorted(expected)}, found {sorted(got)}"]
    for method in expected:
        want, have = expected[method]["logits"], got[method]["logits"]
        if sorted(want) != sorted(have):
            lines.append(f"{method}: scored subjects differ ({len(want)} recorded, "
                         f"{len(have)} now)")
            continue
        moved = {s: have[s] - want[s] for s in want if abs(have[s] - want[s]) > atol}
        if moved:
            worst = max(moved, key=lambda s: abs(moved[s]))
            lines.append(f"{method}: {len(moved)}/{len(want)} logits moved by more than "
                         f"{atol:g} (largest {moved[worst]:+.4f}, subject {worst})")
    return lines
