"""Cost of the meta step's two hypergradients on MNIST, in one process (ratios, not seconds).

    python benchmarks/hypergradient_cost.py --data-dir ../shared/data/mnist \
        --out benchmarks/results/hypergradient-cost-mnist.json

Self-PU phase-2 epochs (the phase where the self-calibration step runs on every batch) with
``selfpu.hypergradient = "double-backward"`` (differentiating through the virtual step) and
``"jvp"`` (one backward pass of the validation objective and one forward-mode pass of the
batch's terms), timed in the order A B B A so that drift in the machine's load affects both
sides. Training time only. Both runs start from the same seed: their statistics are also
compared (the largest relative difference of any recorded training statistic) to show the
two compute the same step.
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

from benchmarks.common import cost_parser, cost_record, mnist_setup, write_json

MODES = ("double-backward", "jvp")


def phase2_run(data: Any, common: dict, mode: str, epochs: int) -> list[dict]:
    """The history of a run whose every epoch is phase 2, with ``mode``'s hypergradient."""
    from adni_pu import config as cfgmod
    from adni_pu.pu.config import TrainConfig, preset_settings
    from adni_pu.pu.trainer import Trainer

    sp = preset_settings("selfpu")
    sp["selfpu"].update({"warmup_epochs": 0, "self_paced_end": epochs, "select_every": 1,
                         "hypergradient": mode})
    cfg = cfgmod.from_dict(TrainConfig, {**common, **sp, "epochs": epochs})
    return Trainer(cfg, data, log=lambda _: None).fit().history


def largest_difference(a: list[dict], b: list[dict]) -> float:
    """The largest relative difference of the ``train/`` statistics of two histories."""
    worst = 0.0
    for ra, rb in zip(a, b):
        for key, va in ra.items():
            vb = rb.get(key)
            if key.startswith("train/") and isinstance(va, float) and isinstance(vb, float) \
                    and not (math.isnan(va) or math.isnan(vb)):
                worst = max(worst, abs(va - vb) / max(abs(va), 1e-12))
    return worst


def main() -> None:
    parser = cost_parser(__doc__, "hypergradient-cost-mnist.json")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    data, common = mnist_setup(args)
    seconds: dict[str, list[float]] = {m: [] for m in MODES}
    histories: dict[str, list[dict]] = {}
    for mode in (*MODES, *reversed(MODES)):
        history = phase2_run(data, common, mode, args.epochs)
        histories.setdefault(mode, history)
        seconds[mode] += [r["time/train_seconds"] for r in history]
    mean = {m: statistics.mean(v) for m, v in seconds.items()}
    result = cost_record(
        "hypergradient-cost-mnist", __file__, args,
        "MNIST (original IDX), 1,000 labelled positives",
        {"model": "mlp6", "phase": 2, "epochs_per_run": args.epochs,
         "order": [*MODES, *reversed(MODES)]},
        {"phase2_seconds_per_epoch": {m: {"mean": mean[m], "runs": seconds[m]}
                                      for m in MODES},
         "jvp_over_double_backward": mean["jvp"] / mean["double-backward"],
         "largest_relative_difference_of_training_statistics": largest_difference(
             histories["double-backward"], histories["jvp"])})
    write_json(args.out, result)
    print(json.dumps(result["results"], indent=2))


if __name__ == "__main__":
    main()
