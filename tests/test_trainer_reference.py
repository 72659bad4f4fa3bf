"""metrics.csv keeps its meaning: the trainer's per-epoch statistics equal recorded values.

The reference file was recorded with the trainer as it was before the sync-free rewrite
(every statistic read with ``.item()`` per batch), at commit 658f582, on an AVX2 CPU.
It guards every refactor of the engine: a change that alters what a column means (or the
batches, the random streams or the loss terms) fails here.

The histories are computed in a child process that forces PyTorch's generic (``default``)
CPU kernels and MKL's compatible code path, so the same kernels run on every x86 CPU: a
CPU with other SIMD units sums in the same order, and a few epochs of trusted-set ranking
cannot turn rounding into different counts. Those kernels agree with the AVX2 recording
to about 1e-6 (relative), with every count equal. To record again (only when a change of
meaning is intended, and say so in the commit):

    python tests/test_trainer_reference.py --record
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REFERENCE = Path(__file__).parent / "data" / "trainer_reference.json"
# The same kernels on every CPU (set before torch is imported, so only in a child process).
PORTABLE_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                    "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# Columns added after the recording that nothing trains on or selects by under the
# recorded settings (the hidden labels' prior of U'; VPU's validation criterion), so they
# cannot change what the recorded columns mean.
ADDED_DIAGNOSTICS = ("/prior_rest_truth", "/variational")
SP = {"warmup_epochs": 1, "self_paced_end": 2, "select_every": 1, "teacher_rampup_epochs": 1}
CASES = {
    "naive": {"method": "naive", "epochs": 1},
    "upu": {"method": "upu", "epochs": 1},
    "nnpu": {"method": "nnpu", "epochs": 2},
    "selfpu": {"method": "selfpu", "epochs": 4, "selfpu": SP},
    "published-code": {"method": "selfpu", "epochs": 4,
                       "selfpu": {**SP, "labels": "entropy", "student_consistency": "per_batch",
                                  "teacher_average": "uniform", "meta_sign_flip": True}},
    "hard-censoring": {"method": "selfpu", "epochs": 3,
                       "selfpu": {**SP, "labels": "hard", "rates": [0.3],
                                  "student_consistency": "none", "teachers": False}},
}


def _history(name: str) -> list[dict]:
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from conftest import blobs, tiny_config

    from adni_pu.data.pu import make_pu_data
    from adni_pu.pu.trainer import Trainer

    torch.set_num_threads(1)
    x, y = blobs(600, 0)
    xt, yt = blobs(200, 1)
    scheme = "censoring" if "censoring" in name else "case-control"
    data = make_pu_data(x, y, xt, yt, n_labelled=60, prior=0.4, val_fraction=0.2, seed=0,
                        scheme=scheme, name="blobs")
    cfg = tiny_config(**CASES[name], batch_size=64, track_test=True)
    history = Trainer(cfg, data, log=lambda _: None).fit().history
    return [{k: v for k, v in row.items()
             if not k.startswith("time/") and not k.endswith(ADDED_DIAGNOSTICS)}
            for row in history]


def _portable_histories(out: Path) -> dict:
    """Every case's history, computed in a child process with :data:`PORTABLE_KERNELS`."""
    env = {**os.environ, **PORTABLE_KERNELS}
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    subprocess.run([sys.executable, __file__, "--histories", str(out)], env=env, check=True,
                   cwd=root)
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def histories(tmp_path_factory) -> dict:
    return _portable_histories(tmp_path_factory.mktemp("reference") / "histories.json")


@pytest.mark.parametrize("name", sorted(CASES))
def test_metrics_equal_recorded_values(name, histories):
    expected = json.loads(REFERENCE.read_text())[name]
    got = histories[name]
    assert histories["_cpu_capability"] == "DEFAULT"  # the portable kernels did run
    assert len(got) == len(expected)
    for epoch, (row, ref) in enumerate(zip(got, expected)):
        assert sorted(row) == sorted(ref), f"epoch {epoch}: columns differ"
        for key, value in ref.items():
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(row[key]), f"epoch {epoch} {key}"
            elif isinstance(value, float):
                assert row[key] == pytest.approx(value, rel=1e-5, abs=1e-7), f"epoch {epoch} {key}"
            else:
                assert row[key] == value, f"epoch {epoch} {key}"


if __name__ == "__main__" and sys.argv[1:2] == ["--histories"]:
    import torch

    result = {n: _history(n) for n in CASES}
    result["_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    Path(sys.argv[2]).write_text(json.dumps(result) + "\n")
elif __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    recorded = _portable_histories(REFERENCE.with_suffix(".new.json"))
    REFERENCE.with_suffix(".new.json").unlink()
    REFERENCE.write_text(json.dumps(recorded, indent=1) + "\n")
    print(f"wrote {REFERENCE}")
