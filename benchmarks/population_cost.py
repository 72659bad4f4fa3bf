"""Seconds per epoch of MNIST Self-PU: one run as today, and populations of runs as one stack.

    python -m benchmarks.population_cost --device cuda --sizes 1 10 \
        --out benchmarks/results/population-cost-mnist-gpu.json

Modes, each timed in this one process (so their ratios share the machine's state):

- ``alone``: one seed with the ordinary engine (two students one after the other);
- ``population-K``: K seeds (2K networks) in one :class:`~adni_pu.pu.stack.Stack`
  (:func:`adni_pu.pu.population.fit_population`), for each K of ``--sizes``;
- each with the meta step's double backward, and (``--jvp``) its forward-mode form;
- (``--capture``) each population again with its step replayed as a CUDA graph
  (:mod:`adni_pu.pu.replay`), ``population-K-capture``.

A mode trains the full Self-PU preset on full MNIST for ``2 + 1 + 1`` epochs: two of phase 1
(the first also pays for CUDA's start), one of phase 2 (with its selection) and one of
phase 3 (with teachers); the last epoch of each phase is its time (training, selection
and evaluation). The projection for the paper's schedule is 10 x phase 1 + 40 x phase 2 +
150 x phase 3 seconds (the preset's phases). The results file is rewritten after every mode
and a mode already in it is skipped, so an interrupted command continues.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.common import add_out, cost_record, script_parser, write_json

SCHEDULE = {1: 10, 2: 40, 3: 150}  # the Self-PU preset's epochs per phase (200 in all)


def config(seed: int, device: str, hypergradient: str) -> Any:
    """The Self-PU preset's ``TrainConfig`` for a 2 + 1 + 1 epoch run (mlp6)."""
    from adni_pu import config as cfgmod
    from adni_pu.pu.config import TrainConfig, preset_settings

    settings = preset_settings("selfpu")
    settings["selfpu"].update({"warmup_epochs": 2, "self_paced_end": 3,
                               "hypergradient": hypergradient})
    settings.update({"model": "mlp6", "epochs": 4, "seed": seed, "device": device,
                     "progress": False, "weight_decay": 0.0, "selection": "final"})
    return cfgmod.from_dict(TrainConfig, settings)


def phase_seconds(history: list[dict[str, Any]]) -> dict[str, float]:
    """The last epoch of each phase: its whole time (selection, training, evaluation)."""
    return {str(r["phase"]): r["time/epoch_seconds"] for r in history}


def run_mode(size: int | None, args: argparse.Namespace, hypergradient: str,
             capture: bool = False) -> dict[str, Any]:
    """One mode's seconds per epoch by phase, the projection and the peak GPU memory."""
    import torch

    from adni_pu.data.benchmarks import load_benchmark
    from adni_pu.pu.population import fit_population
    from adni_pu.pu.trainer import Trainer

    seeds = list(range(1 if size is None else size))
    trainers = []
    for seed in seeds:
        data = load_benchmark("mnist", args.data_dir, seed=seed)
        trainers.append(Trainer(config(seed, args.device, hypergradient), data,
                                log=lambda msg: None))
    start = time.perf_counter()
    if size is None:
        histories = [trainers[0].fit().history]
    else:
        fit_population(trainers, capture=capture)
        histories = [t.state.history for t in trainers]
    wall = time.perf_counter() - start
    seconds = phase_seconds(histories[0])
    projected = sum(SCHEDULE[int(p)] * s for p, s in seconds.items())
    runs = len(seeds)
    return {"runs": runs, "networks": 2 * runs, "hypergradient": hypergradient,
            "capture": capture,
            "seconds_per_epoch_by_phase": seconds,
            "projected_200_epochs_seconds": projected,
            "projected_200_epochs_seconds_per_run": projected / runs,
            "wall_seconds_4_epochs": wall,
            "peak_gpu_memory_gib": (torch.cuda.max_memory_allocated() / 2**30
                                    if torch.cuda.is_available() else None)}


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data/mnist"))
    add_out(parser, "population-cost-mnist.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--jvp", action="store_true", help="also time hypergradient = jvp")
    parser.add_argument("--capture", action="store_true",
                        help="also time each population with its step as a CUDA graph")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    done: dict[str, Any] = {}
    if args.out.is_file():
        done = json.loads(args.out.read_text()).get("results", {})
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "none"
    modes = [(f"alone-{h}" if size is None else f"population-{size}-{h}", size, h, False)
             for h in (["double-backward", "jvp"] if args.jvp else ["double-backward"])
             for size in [None, *args.sizes]]
    if args.capture:
        modes += [(f"population-{size}-capture-{h}", size, h, True)
                  for _, size, h, _ in modes if size is not None]
    for name, size, hypergradient, capture in modes:
        if name in done:
            continue
        done[name] = run_mode(size, args, hypergradient, capture)
        print(name, json.dumps(done[name]), flush=True)
        gc.collect()  # the mode's trainers and data, so the next peak is the next mode's own
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        result = cost_record("population-cost-mnist", __file__, args,
                        "MNIST (original IDX), n_p = 1000, full training split",
                        {"preset": "selfpu", "model": "mlp6", "gpu": gpu,
                         "epochs_timed": "the last of each phase of a 2 + 1 + 1 epoch run",
                         "projection": SCHEDULE}, done)
        write_json(args.out, result)


if __name__ == "__main__":
    main()
