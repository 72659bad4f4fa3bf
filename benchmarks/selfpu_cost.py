"""Cost of Self-PU relative to nnPU on MNIST, measured in one process (ratios, not seconds).

    python -m benchmarks.selfpu_cost --data-dir ../shared/data/mnist \
        --out benchmarks/results/selfpu-cost-mnist.json

nnPU epochs are timed before and after the Self-PU epochs so that drift in the machine's load
affects both sides; the ratio uses their mean. Training time only (selection included,
evaluation not). Targets: phase 2 <= 8x, phase 3 <= 3.5x an nnPU epoch.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from benchmarks.common import cost_parser, cost_record, mnist_setup, write_json


def train_seconds(cfg: Any, data: Any, phase: int | None = None) -> list[float]:
    """Training seconds of each epoch (of ``phase`` only, when given) of a run of ``cfg``."""
    from adni_pu.pu.trainer import Trainer

    history = Trainer(cfg, data).fit().history
    return [r["time/train_seconds"] for r in history if phase is None or r["phase"] == phase]


def main() -> None:
    parser = cost_parser(__doc__, "selfpu-cost-mnist.json")
    parser.add_argument("--nnpu-epochs", type=int, default=3)
    parser.add_argument("--phase-epochs", type=int, default=2)
    args = parser.parse_args()
    from adni_pu import config as cfgmod
    from adni_pu.pu.config import TrainConfig, preset_settings
    from adni_pu.pu.trainer import Trainer

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
    result = cost_record(
        "selfpu-cost-mnist", __file__, args, "MNIST (original IDX)",
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
    write_json(args.out, result)
    print(json.dumps(result["results"], indent=2))


if __name__ == "__main__":
    main()
