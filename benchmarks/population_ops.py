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
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_out, cost_record, script_parser, write_json
from benchmarks.population_cost import config


def count_mode(size: int | None, args: argparse.Namespace) -> dict[str, Any]:
    """Per phase: batches, ``aten::`` operators per batch and the profiled seconds of one
    run alone (``size`` None) or of a population of ``size`` runs."""
    from torch.profiler import ProfilerActivity, profile

    from adni_pu.data.benchmarks import load_benchmark
    from adni_pu.pu import population
    from adni_pu.pu.trainer import Trainer

    trainers = []
    for seed in range(1 if size is None else size):
        cfg = config(seed, "cpu", "double-backward")
        cfg.epochs, cfg.selfpu.warmup_epochs, cfg.selfpu.self_paced_end = 3, 1, 2
        data = load_benchmark("mnist", args.data_dir, n_labelled=args.n_labelled, seed=seed,
                              train_limit=args.train_limit, test_limit=1000)
        trainers.append(Trainer(cfg, data, log=lambda msg: None))
    for t in trainers:
        t.fit_start()
    out: dict[str, Any] = {"runs": len(trainers)}
    for epoch in range(3):
        rows = [t.epoch_start(epoch) for t in trainers]
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
            t.epoch_end(row, st, start, 0.0)
    return out


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data/mnist"))
    add_out(parser, "population-ops-mnist.json")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--train-limit", type=int, default=6000)
    parser.add_argument("--n-labelled", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    results = {"alone": count_mode(None, args)}
    for size in args.sizes:
        results[f"population-{size}"] = count_mode(size, args)
        print(json.dumps(results, indent=1), flush=True)
    out = cost_record("population-ops-mnist", __file__, args,
                 f"MNIST (original IDX), seeded subset of {args.train_limit} training images",
                 {"preset": "selfpu", "model": "mlp6", "epochs": "1 per phase",
                  "counted": "aten:: operators recorded by torch.profiler in the training "
                             "pass, per batch"}, results)
    write_json(args.out, out)


if __name__ == "__main__":
    main()
