"""Selection rules compared on the validation split alone (the tuning log's step 10).

The best-epoch rule keeps the lowest validation PU risk over every epoch and candidate. With
about 100 labelled validation positives that minimum is partly luck (the winner's curse),
and a rule's own validation score cannot say how much: it is the score the rule optimised.
This script judges a rule on data it did not choose with. For every run folder that kept its
validation logits (``record_val_logits = true``: ``seed*/val_logits/``) it draws many random
halvings of the validation split (labelled positives and the other examples halved
separately, so each half keeps the split's mix); each rule chooses an (epoch, model) by the
PU risk on one half, and the choice is scored by the same unbiased PU risk on the other half,
both ways round. A rule's **held-out risk** is the mean over halvings; lower is better.

Rules (``pool``: the models that compete at an epoch, as the trainer's ``candidates``: the
teachers once they exist, else the students, else the one model):

- ``best_epoch``: the lowest risk over every epoch and pool model (the trainer's rule);
- ``final``: the last epoch's finalists (the pool and, with two models, their average);
- ``final-average``: the last epoch's average of the two pool models (the teachers), with no
  choice at all (``final_model = "average"``; the one model where the pool has one);
- ``centered-W``: each model's risk averaged over the W epochs centred on an epoch (fewer at
  the ends of the model's epochs), the lowest such mean chooses (model at the centre epoch);
- ``trailing-W``: the same over the W epochs ending at the epoch.

No test number enters a comparison. After the held-out comparison, every rule is also
applied to the whole validation split and the test accuracy of its choice is read from
``metrics.csv``'s ``test_diagnostic`` columns, a diagnostic for the reader (none for the
teachers' average, which has no such column).

    python benchmarks/selection_rules.py runs/rules/vl200-nnpu-s* --json out.json --md out.md
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tomllib

from adni_pu.fileio import atomic_write_text
from adni_pu.pu import criteria, selection
from adni_pu.pu.metrics import average_logits, sigmoid
from adni_pu.pu.recorders import read_metrics_csv
from benchmarks.common import script_parser

WINDOWS = (3, 5, 9, 15, 25)


@dataclass
class ValidationRecord:
    """One seed's validation logits: ``logits[i]`` belongs to ``rows[i] = (epoch, model)``."""

    rows: list[tuple[int, str]]
    logits: np.ndarray  # (len(rows), n_val)
    labelled: np.ndarray  # bool (n_val,)
    unlabelled: np.ndarray  # indices of D_U in the validation split
    prior: float
    prior_u: float
    pools: dict[int, list[str]]  # epoch -> the models that compete there
    finalists: list[str]  # the last epoch's finalists ("average" included)

    def u_mask(self) -> np.ndarray:
        """D_U of the validation split as a boolean mask."""
        mask = np.zeros(len(self.labelled), dtype=bool)
        mask[self.unlabelled] = True
        return mask


def load_record(seed_dir: Path) -> ValidationRecord:
    """Read ``seed_dir/val_logits`` (split.npz and every epoch-NNNN.npz)."""
    folder = seed_dir / "val_logits"
    split_file = folder / "split.npz"
    if not split_file.is_file():
        raise SystemExit(f"{split_file}: missing; run with --set record_val_logits=true")
    split = np.load(split_file)
    final_model = "best"
    if (seed_dir / "config.toml").is_file():
        with (seed_dir / "config.toml").open("rb") as handle:
            final_model = tomllib.load(handle).get("selfpu", {}).get("final_model", "best")
    rows: list[tuple[int, str]] = []
    arrays: list[np.ndarray] = []
    pools: dict[int, list[str]] = {}
    files = sorted(folder.glob("epoch-*.npz"))
    if not files:
        raise SystemExit(f"{folder}: no epoch-NNNN.npz files")
    for path in files:
        epoch = int(path.stem.split("-")[1])
        with np.load(path) as npz:
            names = sorted(npz.files)
            for name in names:
                rows.append((epoch, name))
                arrays.append(npz[name].astype(np.float64))
        pools[epoch] = _pool(names, final_model)
    last = max(pools)
    models = _pool([n for e, n in rows if e == last], "best")
    finalists = list(pools[last])
    if len(models) == 2:
        if (last, "average") not in rows:
            pair = [arrays[rows.index((last, name))] for name in models]
            rows.append((last, "average"))
            arrays.append(average_logits(pair))
        if "average" not in finalists:
            finalists.append("average")
    return ValidationRecord(rows, np.stack(arrays), split["labelled"].astype(bool),
                            split["unlabelled"], float(split["prior"]),
                            float(split["prior_u"]), pools, finalists)


def _pool(names: list[str], final_model: str = "best") -> list[str]:
    """The models that compete at an epoch whose logits hold ``names`` (the trainer's
    :func:`~adni_pu.pu.selection.pool` under ``best_epoch``). (An "average" column is
    recorded wherever the average competed under the run's own rule, e.g. every epoch under
    ``selection = "final"``; the rules here decide for themselves whether it competes.)"""
    return selection.pool(selection.candidates_among(names), final_model, "best_epoch")


Rule = Callable[[ValidationRecord, np.ndarray], int]


def rule_best_epoch(rec: ValidationRecord, risk: np.ndarray) -> int:
    """Row of the lowest risk over every epoch's pool."""
    allowed = [i for i, (e, m) in enumerate(rec.rows) if m in rec.pools.get(e, ())]
    return min(allowed, key=lambda i: risk[i])


def rule_final(rec: ValidationRecord, risk: np.ndarray) -> int:
    """Row of the lowest risk among the last epoch's finalists."""
    last = max(rec.pools)
    allowed = [i for i, (e, m) in enumerate(rec.rows) if e == last and m in rec.finalists]
    return min(allowed, key=lambda i: risk[i])


def rule_final_average(rec: ValidationRecord, risk: np.ndarray) -> int:
    """The last epoch's average of the two pool models, chosen without a comparison (the
    one model where the pool has one)."""
    last = max(rec.pools)
    if (last, "average") in rec.rows:
        return rec.rows.index((last, "average"))
    return rule_final(rec, risk)


def windowed_rule(width: int, centered: bool) -> Rule:
    """The rule that chooses by each pool model's risk averaged over ``width`` epochs."""
    def rule(rec: ValidationRecord, risk: np.ndarray) -> int:
        best, best_score = -1, math.inf
        for name in {m for pool in rec.pools.values() for m in pool}:
            idx = [i for i, (e, m) in enumerate(rec.rows) if m == name and name in rec.pools[e]]
            idx.sort(key=lambda i: rec.rows[i][0])
            series = risk[idx]
            for k in range(len(idx)):
                lo, hi = ((k - width // 2, k + width // 2 + 1) if centered
                          else (k - width + 1, k + 1))
                score = float(series[max(lo, 0):min(hi, len(idx))].mean())
                if score < best_score:
                    best, best_score = idx[k], score
        return best
    return rule


def rules() -> dict[str, Rule]:
    """Every rule compared, by name."""
    out: dict[str, Rule] = {"best_epoch": rule_best_epoch, "final": rule_final,
                            "final-average": rule_final_average}
    for w in WINDOWS:
        out[f"centered-{w}"] = windowed_rule(w, centered=True)
        out[f"trailing-{w}"] = windowed_rule(w, centered=False)
    return out


def halvings(rec: ValidationRecord, n: int, seed: int
             ) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n`` random halvings of the validation split as (mask A, mask B), labelled positives
    and the other examples halved separately."""
    rng = np.random.default_rng(seed)
    size = len(rec.labelled)
    out = []
    for _ in range(n):
        mask = np.zeros(size, dtype=bool)
        for group in (np.flatnonzero(rec.labelled), np.flatnonzero(~rec.labelled)):
            mask[rng.permutation(group)[: len(group) // 2]] = True
        out.append((mask, ~mask))
    return out


def held_out(rec: ValidationRecord, named_rules: dict[str, Rule], n_halvings: int,
             seed: int = 0) -> dict[str, np.ndarray]:
    """Per rule, the held-out risk of its choice for every halving and direction."""
    loss_pos, loss_neg = sigmoid(-rec.logits), sigmoid(rec.logits)
    in_u = rec.u_mask()
    out: dict[str, list[float]] = {name: [] for name in named_rules}
    for a, b in halvings(rec, n_halvings, seed):
        ra = criteria.pu_risks(loss_pos, loss_neg, rec.labelled & a, in_u & a, rec.prior,
                                rec.prior_u)
        rb = criteria.pu_risks(loss_pos, loss_neg, rec.labelled & b, in_u & b, rec.prior,
                                rec.prior_u)
        for name, rule in named_rules.items():
            out[name].append(float(rb[rule(rec, ra)]))
            out[name].append(float(ra[rule(rec, rb)]))
    return {name: np.asarray(v) for name, v in out.items()}


def full_choices(rec: ValidationRecord, named_rules: dict[str, Rule]
                 ) -> dict[str, tuple[int, str, float]]:
    """Each rule applied to the whole validation split: (epoch, model, its risk)."""
    risk = criteria.pu_risks(sigmoid(-rec.logits), sigmoid(rec.logits), rec.labelled,
                              rec.u_mask(), rec.prior, rec.prior_u)
    out = {}
    for name, rule in named_rules.items():
        i = rule(rec, risk)
        out[name] = (rec.rows[i][0], rec.rows[i][1], float(risk[i]))
    return out


def test_accuracy(rows: list[dict[str, str]], epoch: int, model: str) -> float | None:
    """``test_diagnostic/<model>/accuracy`` at ``epoch`` in metrics.csv's rows (a
    diagnostic)."""
    for row in rows:
        if int(row["epoch"]) == epoch:
            value = row.get(f"test_diagnostic/{model}/accuracy", "")
            return float(value) if value not in ("", "nan") else None
    return None


def study(run_dirs: list[Path], n_halvings: int) -> dict[str, Any]:
    """The held-out comparison (and the diagnostics) of every seed folder under run_dirs."""
    named = rules()
    seeds: dict[str, Any] = {}
    for run_dir in run_dirs:
        for seed_dir in sorted(run_dir.glob("seed*")):
            if not (seed_dir / "val_logits").is_dir():
                continue
            rec = load_record(seed_dir)
            scores = held_out(rec, named, n_halvings)
            base = scores["best_epoch"]
            choices = full_choices(rec, named)
            metrics = read_metrics_csv(seed_dir / "metrics.csv")
            seeds[f"{run_dir.name}/{seed_dir.name}"] = {
                "epochs": len(rec.pools), "labelled_val": int(rec.labelled.sum()),
                "rules": {name: {
                    "held_out_risk": float(v.mean()),
                    "minus_best_epoch": float((v - base).mean()),
                    "minus_best_epoch_se": float((v - base).std(ddof=1) / math.sqrt(len(v))),
                    "full_val_choice": {"epoch": choices[name][0], "model": choices[name][1],
                                        "val_risk": choices[name][2]},
                    "test_accuracy_diagnostic": test_accuracy(metrics, *choices[name][:2]),
                } for name, v in scores.items()}}
    if not seeds:
        raise SystemExit("no seed folder with val_logits/ under " + ", ".join(map(str, run_dirs)))
    return {"n_halvings": n_halvings, "rules": list(named), "seeds": seeds,
            "summary": _summary(seeds, list(named))}


def _summary(seeds: dict[str, Any], names: list[str]) -> dict[str, Any]:
    out = {}
    for name in names:
        diffs = [s["rules"][name]["minus_best_epoch"] for s in seeds.values()]
        tests = [s["rules"][name]["test_accuracy_diagnostic"] for s in seeds.values()]
        out[name] = {
            "held_out_risk_mean": float(np.mean([s["rules"][name]["held_out_risk"]
                                                 for s in seeds.values()])),
            "minus_best_epoch_mean": float(np.mean(diffs)),
            "lower_than_best_epoch_on": sum(d < 0 for d in diffs),
            "seeds": len(diffs),
            "test_accuracy_diagnostic_mean": (float(np.mean(tests)) if None not in tests
                                              else None),
        }
    return out


def markdown(result: dict[str, Any]) -> str:
    """The study as tables: held-out risk per rule and seed, then the summary."""
    seeds = result["seeds"]
    lines = [f"Held-out validation PU risk of each rule's choice (mean over "
             f"{result['n_halvings']} random halvings, both directions), minus the best-epoch "
             "rule's (negative: better than best_epoch; +- one standard error over halvings).",
             "", "| rule | " + " | ".join(seeds) + " | lower than best_epoch on |",
             "|---|" + "---|" * (len(seeds) + 1)]
    for name in result["rules"]:
        cells = []
        for s in seeds.values():
            r = s["rules"][name]
            cells.append(f"{r['held_out_risk']:.4f} ({r['minus_best_epoch']:+.4f} "
                         f"+- {r['minus_best_epoch_se']:.4f})")
        summ = result["summary"][name]
        lines.append(f"| {name} | " + " | ".join(cells)
                     + f" | {summ['lower_than_best_epoch_on']} of {summ['seeds']} |")
    lines += ["", "Each rule on the whole validation split: its choice (epoch, model) and that "
              "model's test accuracy % (a diagnostic read after the comparison; none for the "
              "teachers' average).", "",
              "| rule | " + " | ".join(seeds) + " | mean test % |",
              "|---|" + "---|" * (len(seeds) + 1)]
    for name in result["rules"]:
        cells = []
        for s in seeds.values():
            r = s["rules"][name]
            c, t = r["full_val_choice"], r["test_accuracy_diagnostic"]
            cells.append(f"{c['epoch']}, {c['model']}: " + ("-" if t is None else f"{100 * t:.2f}"))
        mean = result["summary"][name]["test_accuracy_diagnostic_mean"]
        lines.append(f"| {name} | " + " | ".join(cells) + " | "
                     + ("-" if mean is None else f"{100 * mean:.2f}") + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = script_parser(__doc__)
    ap.add_argument("runs", nargs="+", type=Path, help="run folders holding seed*/val_logits")
    ap.add_argument("--halvings", type=int, default=200)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args(argv)
    result = study(args.runs, args.halvings)
    text = markdown(result)
    print(text)
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=2) + "\n")
    if args.md:
        atomic_write_text(args.md, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
