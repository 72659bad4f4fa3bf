"""Pictures of a run: training curves and the trusted set over epochs (the paper's Figure 3)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from adni_pu.fileio import atomic_write


def _series(history: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in history:
        value = row.get(key)
        if isinstance(value, (int, float)) and not math.isnan(value):
            xs.append(int(row["epoch"]) + 1)
            ys.append(float(value))
    return xs, ys


def _save(fig: Any, path: Path) -> None:
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"))


def curve_panels(history: list[dict[str, Any]], criterion: str
                 ) -> list[tuple[str, list[tuple[list[int], list[float], str]]]]:
    """The panels of ``curves.png`` that have data: ``(title, [(epochs, values, label)])``
    for the training loss, the validation selection criterion and the accuracies (the test
    split's only where a run tracked it, as a diagnostic)."""
    keys = sorted({k for row in history for k in row})
    panels: list[tuple[str, list[tuple[list[int], list[float], str]]]] = [
        ("training loss", []), (f"validation {criterion} (selection criterion)", []), ("", [])]
    for key in keys:
        if key.startswith("train/") and key.endswith("/loss"):
            panels[0][1].append((*_series(history, key), key.split("/")[1]))
        if key.startswith("val/") and key.endswith(f"/{criterion}"):
            panels[1][1].append((*_series(history, key), key.split("/")[1]))
        if key.startswith("test_diagnostic/") or (key.startswith("val/")
                                                   and key.endswith("/pn_accuracy")):
            panels[2][1].append((*_series(history, key), key.replace("_diagnostic", "")))
    tested = any(label.startswith("test/") for _, _, label in panels[2][1])
    panels[2] = ("accuracy (test: diagnostic only)" if tested else "validation accuracy",
                 panels[2][1])
    return [(title, [s for s in series if s[0]]) for title, series in panels
            if any(xs for xs, _, _ in series)]


def plot_training(history: list[dict[str, Any]], run_dir: Path, criterion: str) -> list[Path]:
    """Write ``curves.png`` (and ``trusted_set.png`` for Self-PU runs) into ``run_dir``;
    ``curves.png`` has one panel per :func:`curve_panels` entry (none without data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not history:
        return []
    keys = sorted({k for row in history for k in row})
    written = []
    panels = curve_panels(history, criterion)
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
        for ax, (title, series) in zip(axes[0], panels):
            for xs, ys, label in series:
                ax.plot(xs, ys, label=label)
            ax.set_title(title)
            ax.set_xlabel("epoch")
            ax.legend(fontsize=7)
        _save(fig, run_dir / "curves.png")
        plt.close(fig)
        written.append(run_dir / "curves.png")
    size_keys = [k for k in keys if k.startswith("trusted/") and k.endswith("/size")]
    if size_keys:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for key in size_keys:
            name = key.split("/")[1]
            axes[0].plot(*_series(history, key), label=name)
            axes[1].plot(*_series(history, f"trusted/{name}/label_accuracy"), label=name)
        axes[0].set_title("trusted set size")
        axes[1].set_title("trusted set label accuracy (hidden truth)")
        for ax in axes:
            ax.set_xlabel("epoch")
            ax.legend(fontsize=7)
        _save(fig, run_dir / "trusted_set.png")
        plt.close(fig)
        written.append(run_dir / "trusted_set.png")
    return written


def roc_plot(scores: np.ndarray, truth: np.ndarray, path: Path, title: str = "",
             auc: dict[str, float] | None = None, curves: dict[str, tuple] | None = None) -> Path:
    """Save an ROC plot (one curve, or several named ``(scores, truth)`` pairs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from adni_pu.pu.metrics import format_ci, roc_curve

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    for name, (s, t) in (curves or {"model": (scores, truth)}).items():
        fpr, tpr = roc_curve(s, t)
        label = name
        if curves is None and auc is not None:
            label = f"AUC {format_ci(auc)}"
        ax.plot(fpr, tpr, lw=1.8, label=label)
    ax.plot([0, 1], [0, 1], ls="--", c="grey", lw=0.8)
    ax.set(xlabel="1 - specificity", ylabel="sensitivity", xlim=(-0.01, 1.01),
           ylim=(-0.01, 1.01), title=title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return path
