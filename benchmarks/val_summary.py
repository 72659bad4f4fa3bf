"""Summarise benchmark run folders by their validation curves (the tuning log's numbers).

For every run folder under the given roots (a folder holding ``seed*/metrics.csv``), this
reads the per-epoch rows the trainer wrote and reports, per seed:

- the epoch and model with the best validation score over the whole run ("best_epoch" rule)
  and that score;
- at the last epoch, the validation score of every candidate (teachers once they exist,
  else students, else the one model) and the candidate the validation split prefers there
  ("final" rule: a handful of finalists, one comparison; the trainer's own record of them,
  the teachers' average included, where the run folder's ``selection.json`` has it);
- Self-PU's ``prior_rest`` (the positive fraction assumed for D_U minus the trusted set) at
  each epoch where it changed, per student;
- the share of batches where Kiryo's correction fired (mean over epochs and models) and
  the mean seconds per epoch of each phase;
- test accuracy of each pick, read from the ``test_diagnostic`` columns. These are
  reported, never used to choose: every decision in the tuning log reads the ``val_*``
  fields alone.

    python benchmarks/val_summary.py runs/probe --json out.json

Runs cut short (no ``result.json``) are summarised over the epochs they finished, and say so.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path
from typing import Any

from adni_pu.pu import selection
from adni_pu.pu.criteria import LOWER_IS_BETTER  # the trainer's own criteria
from benchmarks.common import script_parser


def _float(value: str | None) -> float | None:
    if value in (None, ""):
        return None
    out = float(value)
    return None if math.isnan(out) else out


def summarise_seed(seed_dir: Path, criterion: str = "pu_risk") -> dict[str, Any]:
    """The validation summary of one seed's run folder (see the module docstring)."""
    with (seed_dir / "metrics.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise SystemExit(f"{seed_dir / 'metrics.csv'}: no epochs recorded")
    lower = LOWER_IS_BETTER[criterion]
    better = (lambda a, b: a < b) if lower else (lambda a, b: a > b)

    def scores(row: dict[str, str]) -> dict[str, float]:
        out = {}
        for key, value in row.items():
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "val" and parts[2] == criterion:
                v = _float(value)
                if v is not None:
                    out[parts[1]] = v
        return out

    def test(row: dict[str, str], model: str) -> float | None:
        return _float(row.get(f"test_diagnostic/{model}/accuracy"))

    best: dict[str, Any] = {}
    for row in rows:
        pool = row.get("selected/candidate") and scores(row)
        if not pool:
            continue
        chosen = row["selected/candidate"]
        value = _float(row.get("selected/score"))
        if value is None:
            continue
        if not best or better(value, best["val_score"]):
            best = {"epoch": int(row["epoch"]), "model": chosen, "val_score": value,
                    "test_accuracy": test(row, chosen)}
    last = rows[-1]
    last_scores = scores(last)
    finalists = {k: last_scores[k] for k in selection.candidates_among(list(last_scores))}
    pick = selection.choose(finalists, lower) if finalists else None
    each = {k: test(last, k) for k in finalists}
    recorded = _recorded_finalists(seed_dir, criterion)
    if recorded is not None:  # the trainer's own finalists (the teachers' average included)
        finalists, pick, each = recorded
    fired = [_float(v) for row in rows for k, v in row.items() if k.endswith("/nn_correction")]
    fired = [v for v in fired if v is not None]
    tests = [_float(v) for row in rows for k, v in row.items() if k.startswith("test_diagnostic/")]
    tests = [v for v in tests if v is not None]
    priors: dict[str, dict[str, float]] = {}  # at each epoch where a prior_rest changed
    previous: dict[str, float] = {}
    for row in rows:
        for key, value in row.items():
            parts = key.split("/")
            if len(parts) != 3 or parts[0] != "trusted" or parts[2] != "prior_rest":
                continue
            v = _float(value)
            if v is not None and previous.get(parts[1]) != v:
                previous[parts[1]] = v
                priors.setdefault(row["epoch"], {})[parts[1]] = v
    seconds: dict[str, list[float]] = {}
    for row in rows:
        value = _float(row.get("time/epoch_seconds"))
        if value is not None:
            seconds.setdefault(f"phase{row['phase']}", []).append(value)
    return {
        "seed_dir": str(seed_dir),
        "complete": (seed_dir / "result.json").is_file(),
        "epochs_done": len(rows),
        "criterion": criterion,
        "best_epoch_rule": best,
        "final_rule": {
            "epoch": int(last["epoch"]),
            "val_scores": finalists,
            "model": pick,
            "val_score": finalists.get(pick) if pick else None,
            "test_accuracy": each.get(pick) if pick else None,
            "test_accuracy_each": each,
        },
        "nn_correction_share": statistics.fmean(fired) if fired else None,
        "test_accuracy_test_selected": max(tests) if tests else None,
        "seconds_per_epoch": {k: round(statistics.fmean(v), 3) for k, v in seconds.items()},
        "prior_rest_at_selections": priors,
    }


def _recorded_finalists(seed_dir: Path, criterion: str
                        ) -> tuple[dict[str, float], str, dict[str, float | None]] | None:
    """The finalists the trainer recorded (``selection.json``; their test accuracies from
    ``result.json``), when the run wrote them under this criterion; else None."""
    path = seed_dir / "selection.json"
    if not path.is_file():
        return None
    selection = json.loads(path.read_text())
    final = selection.get("finalists")
    if not final or selection.get("val_criterion", criterion) != criterion:
        return None
    result_path = seed_dir / "result.json"
    tests: dict[str, Any] = {}
    if result_path.is_file():
        tests = json.loads(result_path.read_text()).get("test_accuracy_finalists_diagnostic") or {}
    return (dict(final["val_scores"]), final["choice"],
            {k: tests.get(k) for k in final["val_scores"]})


def summarise(roots: list[Path], criterion: str = "pu_risk") -> dict[str, Any]:
    """Per run folder (name relative to its root): the summary of each seed."""
    out: dict[str, Any] = {}
    for root in roots:
        for metrics in sorted(root.glob("**/seed*/metrics.csv")):
            seed_dir = metrics.parent
            run = str(seed_dir.parent.relative_to(root)) or root.name
            out.setdefault(run, {})[seed_dir.name] = summarise_seed(seed_dir, criterion)
    return out


def markdown(summary: dict[str, Any]) -> str:
    """One line per run and seed: both rules' validation picks, then their test numbers."""
    lines = ["| run | seed | epochs | best-epoch rule: val (epoch, model) | final rule: val "
             "(model) | nn corr. | test: best-epoch / final / test-selected |",
             "|---|---|---|---|---|---|---|"]

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.2f}"

    for run, seeds in summary.items():
        for seed, s in seeds.items():
            b, f = s["best_epoch_rule"], s["final_rule"]
            done = "" if s["complete"] else " (cut short)"
            share = "-" if s["nn_correction_share"] is None else f"{s['nn_correction_share']:.2f}"
            lines.append(
                f"| {run} | {seed} | {s['epochs_done']}{done} | "
                f"{b.get('val_score', float('nan')):.4f} ({b.get('epoch')}, {b.get('model')}) | "
                f"{(f['val_score'] if f['val_score'] is not None else float('nan')):.4f} "
                f"({f['model']}) | {share} | {pct(b.get('test_accuracy'))} / "
                f"{pct(f['test_accuracy'])} / {pct(s['test_accuracy_test_selected'])} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = script_parser(__doc__)
    parser.add_argument("roots", type=Path, nargs="+")
    parser.add_argument("--criterion", default="pu_risk", choices=sorted(LOWER_IS_BETTER))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--md", type=Path, default=None)
    a = parser.parse_args()
    summary = summarise(a.roots, a.criterion)
    text = markdown(summary)
    print(text, end="")
    from adni_pu.fileio import atomic_write_text

    if a.json is not None:
        atomic_write_text(a.json, json.dumps(summary, indent=2) + "\n")
    if a.md is not None:
        atomic_write_text(a.md, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
