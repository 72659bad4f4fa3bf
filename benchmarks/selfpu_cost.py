"""Cost of Self-PU relative to nnPU on MNIST, measured in one process (ratios, not seconds).

    python benchmarks/selfpu_cost.py --data-dir ../shared/data/mnist \
        --out benchmarks/results/selfpu-cost-mnist.json

nnPU epochs are timed before and after the Self-PU epochs so that drift in the machine's load
affects both sides; the ratio uses their mean. Training time only (selection included,
evaluation not). Targets (issue 3): phase 2 <= 8x, phase 3 <= 3.5x an nnPU epoch.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from adni_pu import config as cfgmod
from adni_pu import fileio
from adni_pu.data.benchmarks import load_benchmark
from adni_pu.provenance import machine_description, package_versions
from adni_pu.pu.config import TrainConfig, preset_settings
from adni_pu.pu.trainer import Trainer


def train_seconds(cfg: TrainConfig, data, phase: int | None = None) -> list[float]:
    history = Trainer(cfg, data).fit().history
    return [r["time/train_seconds"] for r in history if phase is None or r["phase"] == phase]


def record(name: str, script: str, args: argparse.Namespace, data: str,
           settings: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    """A results file of a CPU cost benchmark: its command (from ``args``), date, machine
    (with ``args.threads``), data, settings, package versions and results."""
    return {
        "benchmark": name,
        "command": " ".join(["python", script, *_options(vars(args))]),
        "date": dt.date.today().isoformat(),
        "machine": machine_description() + f", {args.threads} torch thread(s)",
        "data": data,
        "settings": settings,
        "versions": package_versions(),
        "results": results,
    }


def _options(values: dict[str, Any]) -> list[str]:
    """Parsed options back as command-line words (flags bare, lists spread)."""
    words: list[str] = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            words += [flag] if value else []
        elif isinstance(value, (list, tuple)):
            words += [flag, *map(str, value)]
        else:
            words += [flag, str(value)]
    return words


def cost_parser(doc: str, out: str) -> argparse.ArgumentParser:
    """The options every MNIST CPU cost benchmark takes: data, output file, threads."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data/mnist"))
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--threads", type=int, default=1)
    return parser


def mnist_setup(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """MNIST's PU data (seed 0) and the settings every timed run shares (mlp6, CPU)."""
    torch.set_num_threads(args.threads)
    data = load_benchmark("mnist", args.data_dir, seed=0)
    return data, {"model": "mlp6", "progress": False, "device": "cpu", "threads": args.threads}


def main() -> None:
    parser = cost_parser(__doc__, "benchmarks/results/selfpu-cost-mnist.json")
    parser.add_argument("--nnpu-epochs", type=int, default=3)
    parser.add_argument("--phase-epochs", type=int, default=2)
    args = parser.parse_args()
    data, common = mnist_setup(args)
    nnpu = cfgmod.from_dict(TrainConfig, {**common, **preset_settings("nnpu"),
                                          "epochs": args.nnpu_epochs})
    k = args.phase_epochs
    sp = preset_settings("selfpu")
    sp["selfpu"].update({"warmup_epochs": 0, "self_paced_end": k, "select_every": 1})
    selfpu = cfgmod.from_dict(TrainConfig, {**common, **sp, "epochs": 2 * k})
    before = train_seconds(nnpu, data)
    history = Trainer(selfpu, data).fit().history
    after = train_seconds(nnpu, data)
    base = statistics.mean(before + after)
    p2 = statistics.mean(r["time/train_seconds"] for r in history if r["phase"] == 2)
    p3 = statistics.mean(r["time/train_seconds"] for r in history if r["phase"] == 3)
    result = record(
        "selfpu-cost-mnist", "benchmarks/selfpu_cost.py", args, "MNIST (original IDX)",
        {"batch_size": nnpu.batch_size, "model": "mlp6", "n_labelled": 1000,
         "selfpu": cfgmod.to_dict(selfpu.selfpu)},
        {
            "nnpu_seconds_per_epoch": {"mean": base, "runs": before + after},
            "selfpu_phase2_seconds_per_epoch": p2,
            "selfpu_phase3_seconds_per_epoch": p3,
            "phase2_ratio": p2 / base,
            "phase3_ratio": p3 / base,
            "targets": {"phase2_ratio": 8.0, "phase3_ratio": 3.5},
        })
    fileio.atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["results"], indent=2))


if __name__ == "__main__":
    main()
