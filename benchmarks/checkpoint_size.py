"""How large a run's checkpoint is for CIFAR-10's CNN-13 (nnPU, Self-PU; float32, bfloat16).

    python benchmarks/checkpoint_size.py --out benchmarks/results/checkpoint-size-cnn13.json

The size depends on the model and the method, not on the data: each run trains two epochs
on 96 random 32 x 32 images (Self-PU reaches phase 3, so both teachers exist) and the
checkpoint written after the last epoch is measured, raw and compressed as the piecewise
runner's transfer compresses it (``xz -6``, ``gzip -6``). The device tool moves at most
64 MiB each way (16 MiB per returned file), the CIFAR-10 JPEG archive included.
"""

from __future__ import annotations

import json
import lzma
import tempfile
import zlib
from pathlib import Path

from benchmarks.common import add_out, command_line, results_record, script_parser, write_json

MIB = 2**20


def measure(method: str, precision: str, folder: Path) -> dict[str, float]:
    """Sizes (MiB) of the last checkpoint of a 2-epoch run: raw, xz, gzip; best model."""
    import numpy as np
    import torch

    from adni_pu import config as cfgmod
    from adni_pu.data.pu import make_pu_data
    from adni_pu.pu.config import TrainConfig, preset_settings
    from adni_pu.pu.trainer import Trainer

    rng = np.random.default_rng(0)
    y = (rng.random(96) < 0.4).astype(np.int64)
    y[:20] = 1
    yt = np.r_[np.ones(8), np.zeros(8)].astype(np.int64)
    data = make_pu_data(torch.randn(96, 3, 32, 32), y, torch.randn(16, 3, 32, 32), yt,
                        n_labelled=12, prior=0.4, val_fraction=0.25, seed=0)
    settings = preset_settings(method)
    if method == "selfpu":
        settings["selfpu"].update(warmup_epochs=0, self_paced_end=1, select_every=1)
    cfg = cfgmod.from_dict(TrainConfig, {**settings, "model": "cnn13", "epochs": 2,
                                         "batch_size": 32, "progress": False,
                                         "device": "cpu", "checkpoint_precision": precision})
    run = folder / f"{method}-{precision}"
    Trainer(cfg, data, run, log=lambda _: None).fit()
    raw = (run / "checkpoints" / "last.pt").read_bytes()
    return {"last_pt_mib": len(raw) / MIB,
            "xz6_mib": len(lzma.compress(raw, preset=6)) / MIB,
            "gzip6_mib": len(zlib.compress(raw, 6)) / MIB,
            "best_model_pt_mib": (run / "best_model.pt").stat().st_size / MIB}


def main() -> None:
    parser = script_parser(__doc__)
    add_out(parser, "checkpoint-size-cnn13.json")
    args = parser.parse_args()
    import torch

    from adni_pu.models.cnn13 import CNN13

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        sizes = {f"{m}/{p}": measure(m, p, Path(tmp))
                 for m in ("nnpu", "selfpu") for p in ("float32", "bfloat16")}
    params = sum(p.numel() for p in CNN13().parameters())
    result = results_record(
        "checkpoint-size-cnn13", command_line(__file__),
        "96 random 32x32x3 images (size does not depend on the data)",
        {k: {n: round(v, 2) for n, v in d.items()} for k, d in sizes.items()},
        cnn13_parameters=params)
    write_json(args.out, result)
    print(json.dumps(result["results"], indent=2))


if __name__ == "__main__":
    main()
