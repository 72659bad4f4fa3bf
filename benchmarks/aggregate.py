"""Build the README's MNIST table from the committed results files (benchmarks/results/).

    python benchmarks/aggregate.py [--results DIR] [--out benchmarks/results/mnist-table.md]

Each method's file is written by one `adni-pu benchmark mnist ...` command (recorded inside
the file); this script only reads them, so the table can be rebuilt without training.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# Self-PU paper, Table 2 (MNIST, n_p = 1000): test-selected mean (std), percent.
PAPER = {"naive": None, "upu": (92.52, 0.39), "nnpu": (93.41, 0.20), "selfpu": (94.21, 0.54)}
ORDER = ["naive", "upu", "nnpu", "selfpu"]


def fmt(d: dict | None) -> str:
    if not d or d.get("n", 0) == 0:
        return "n/a"
    return f"{d['mean']:.2f} ({d['std']:.2f}), n={d['n']}"


def table(results_dir: Path) -> str:
    rows = ["| method | ours: test acc. %, validation-selected | ours: test-selected % "
            "(diagnostic) | paper (test-selected) | epochs | s/epoch by phase |",
            "|---|---|---|---|---|---|"]
    for method in ORDER:
        path = results_dir / f"mnist-{method}.json"
        if not path.is_file():
            continue
        summary = json.loads(path.read_text())
        r = summary["results"][method]
        paper = PAPER[method]
        paper_text = f"{paper[0]:.2f} ({paper[1]:.2f})" if paper else "-"
        secs = ", ".join(f"{p}: {v['mean']:.1f}" for p, v in r["seconds_per_epoch"].items())
        rows.append(f"| {method} | {fmt(r['test_accuracy'])} | "
                    f"{fmt(r['test_accuracy_test_selected'])} | {paper_text} | "
                    f"{summary['settings']['epochs']} | {secs} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mnist-table.md"))
    args = parser.parse_args()
    text = table(args.results)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
