"""Operators dispatched per training batch of MNIST Self-PU, by phase: one run with the
ordinary engine against a population of runs, counted by the PyTorch profiler on the CPU.

    python benchmarks/population_ops.py --sizes 1 4 \
        --out benchmarks/results/population-ops-mnist.json

A small model's GPU step is bound by the host's work per operator (each one a dispatch and
at least one kernel launch), and that count does not depend on the device, so it is
measured here on the CPU; seconds on a GPU are `population_cost.py`'s. Each mode trains
the Self-PU preset for three epochs (one per phase) on a seeded subset of MNIST and profiles
each epoch's training pass alone (not selection or evaluation): every ``aten::`` operator
the profiler records (nested ones included) per batch, and the training pass's seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from adni_pu import fileio
from adni_pu.data.benchmarks import load_benchmark
from adni_pu.pu import population
from adni_pu.pu.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from population_cost import config  # noqa: E402
from selfpu_cost import record  # noqa: E402


def count_mode(size: int | None, args: argparse.Namespace) -> dict[str, Any]:
    trainers = []
    for seed in range(1 if size is None else size):
        cfg = config(seed, "cpu", "double-backward")
        cfg.epochs, cfg.selfpu.warmup_epochs, cfg.selfpu.self_paced_end = 3, 1, 2
        data = load_benchmark("mnist", args.data_dir, n_labelled=args.n_labelled, seed=seed,
                              train_limit=args.train_limit, test_limit=1000)
        trainers.append(Trainer(cfg, data, log=lambda msg: None))
    for t in trainers:
        t.begin_fit()
    out: dict[str, Any] = {"runs": len(trainers)}
    for epoch in range(3):
        rows = [t.open_epoch(epoch) for t in trainers]
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            if size is None:
                stats = [trainers[0].train_epoch(epoch)]
            else:
                stats = population.train_epoch(trainers, epoch)
        seconds = time.perf_counter() - start
        batches = len(trainers[0].plan_epoch(epoch, rows[0]["phase"])[0].sizes)
        ops = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
        out[f"phase{rows[0]['phase']}"] = {"batches": batches, "ops_per_batch": ops / batches,
                                           "train_seconds_profiled": seconds}
        for t, row, st in zip(trainers, rows, stats):
            t.close_epoch(row, st, start, 0.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data/mnist"))
    parser.add_argument("--out", type=Path,
                        default=Path("benchmarks/results/population-ops-mnist.json"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--train-limit", type=int, default=6000)
    parser.add_argument("--n-labelled", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {"alone": count_mode(None, args)}
    for size in args.sizes:
        results[f"population-{size}"] = count_mode(size, args)
        print(json.dumps(results, indent=1), flush=True)
    out = record("population-ops-mnist", "benchmarks/population_ops.py", args,
                 f"MNIST (original IDX), seeded subset of {args.train_limit} training images",
                 {"preset": "selfpu", "model": "mlp6", "epochs": "1 per phase",
                  "counted": "aten:: operators recorded by torch.profiler in the training "
                             "pass, per batch"}, results)
    fileio.atomic_write_text(args.out, json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
