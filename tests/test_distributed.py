"""Multi-process training: 2 gloo processes on the CPU end with identical weights."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _data():
    from adni_pu.data.pu import make_pu_data

    rng = np.random.default_rng(0)
    y = (rng.random(400) < 0.4).astype(np.int64)
    x = rng.normal(size=(400, 2)).astype(np.float32)
    x[:, 0] += 1.6 * (2 * y - 1)
    return make_pu_data(torch.from_numpy(x[:300]), y[:300], torch.from_numpy(x[300:]), y[300:],
                        n_labelled=40, prior=0.4, val_fraction=0.2, seed=0)


def _config(preset: str):
    from adni_pu import config as cfgmod
    from adni_pu.pu.config import TrainConfig, preset_settings

    base = {"model": "mlp6", "model_args": {"in_features": 2, "hidden": 8, "depth": 2},
            "epochs": 3, "batch_size": 32, "lr": 1e-2, "progress": False, "device": "cpu",
            "threads": 1}
    base.update(preset_settings(preset))
    if preset == "selfpu":
        base["selfpu"].update({"warmup_epochs": 1, "self_paced_end": 2, "select_every": 1,
                               "teacher_rampup_epochs": 1})
    return cfgmod.from_dict(TrainConfig, base)


def _worker(rank: int, world: int, port: int, out: str, presets: list[str]) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    torch.set_num_threads(1)
    from adni_pu.distributed import init_from_env, shutdown
    from adni_pu.pu.trainer import Trainer

    run = init_from_env("gloo")
    for preset in presets:
        trainer = Trainer(_config(preset), _data(), Path(out) / preset, log=lambda m: None,
                          distributed=run)
        fit = trainer.fit()
        state = {f"{st.name}.{k}": v for st in trainer.state.students
                 for k, v in st.model.state_dict().items()}
        torch.save({"state": state, "best_epoch": fit.best_epoch,
                    "n_history": len(fit.history)}, Path(out) / f"{preset}-rank{rank}.pt")
    shutdown()


PRESETS = ["nnpu", "selfpu"]  # selfpu: all three phases, with the meta (reweighting) step


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(2, _free_port(), str(out), PRESETS), nprocs=2, join=True)
    return out


@pytest.mark.parametrize("preset", PRESETS)
def test_two_gloo_processes_end_with_identical_weights(two_rank_results, preset):
    a, b = (torch.load(two_rank_results / f"{preset}-rank{r}.pt", weights_only=False)
            for r in range(2))
    assert a["state"].keys() == b["state"].keys()
    for key in a["state"]:
        assert torch.equal(a["state"][key], b["state"][key]), key
    assert a["best_epoch"] == b["best_epoch"] and a["n_history"] == 3
    # rank 0 alone wrote the run folder, and the weights moved away from initialisation
    run = two_rank_results / preset
    assert (run / "best_model.pt").is_file() and (run / "metrics.csv").is_file()
    torch.manual_seed(0)
    from adni_pu.models import build_model

    init = build_model("mlp6", in_features=2, hidden=8, depth=2).state_dict()
    first = next(k for k in init if k.endswith("weight"))
    name = "model" if preset == "nnpu" else "student1"
    assert not torch.equal(init[first], a["state"][f"{name}.{first}"])


def test_batches_are_sharded_evenly():
    from adni_pu.distributed import DistributedError, DistributedRun

    batches = [np.arange(i, i + 2) for i in range(0, 10, 2)]
    r0, r1 = DistributedRun(0, 2), DistributedRun(1, 2)
    assert r0.round_batches(5, 40) == 6
    assert [b[0] for b in r0.shard(batches, 0)] == [0, 4, 8]
    assert [b[0] for b in r1.shard(batches, 0)] == [2, 6]
    with pytest.raises(DistributedError, match="BatchNorm"):
        r0.round_batches(5, 10)


def _volume_worker(rank: int, world: int, port: int, manifest: str, out: str,
                   overrides: list[str]) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})
    torch.set_num_threads(1)
    from adni_pu.distributed import shutdown
    from adni_pu.workflows.train import train_volumes
    from adni_pu.workflows.volume_settings import load_volume_config

    cfg = load_volume_config(None, overrides, preset="nnpu")
    fit = train_volumes(manifest, cfg, out, log=lambda m: None)
    torch.save({"best_epoch": fit.best_epoch}, Path(out).parent / f"vol-rank{rank}.pt")
    shutdown()


def test_train_volumes_under_two_gloo_processes(tmp_path):
    """Volume DDP: ``train_volumes`` in two gloo processes. Runs by default: about 24 s on
    the 2-core machine, of which the imports and each rank's volume cache take most (one
    epoch instead of two saves under 2 s)."""
    from volume_helpers import make_volume_cohort, tiny_overrides

    manifest = make_volume_cohort(tmp_path / "cohort")
    overrides = [*tiny_overrides(2), "train.batch_size=4"]
    mp.spawn(_volume_worker, args=(2, _free_port(), str(manifest), str(tmp_path / "run"),
                                   overrides), nprocs=2, join=True)
    run = tmp_path / "run"
    for name in ("best_model.pt", "val_predictions.csv", "splits.csv", "run.json"):
        assert (run / name).is_file(), name
    a, b = (torch.load(tmp_path / f"vol-rank{r}.pt") for r in range(2))
    assert a == b
