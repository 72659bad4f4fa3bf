"""Shared fixtures: small synthetic PU problems and the location of ../shared/data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def shared_path(*parts: str) -> Path:
    """A path under ../shared/data; the calling test is skipped when it is absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not available")
    return path


def blobs(n: int, seed: int, dim: int = 2, shift: float = 1.6) -> tuple[torch.Tensor, np.ndarray]:
    """Two Gaussian classes in ``dim`` dimensions; positives are shifted by ``shift``."""
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.4).astype(np.int64)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    x[:, 0] += shift * (2 * y - 1)
    return torch.from_numpy(x), y


@pytest.fixture
def tiny_pu():
    """A 2-D PU problem: 1,200 training, 400 test examples, 120 labelled positives."""
    from adni_pu.data.pu import make_pu_data

    x, y = blobs(1200, 0)
    xt, yt = blobs(400, 1)
    return make_pu_data(x, y, xt, yt, n_labelled=120, prior=0.4, val_fraction=0.2, seed=0,
                        name="blobs")


def tiny_config(**overrides):
    """A fast TrainConfig for the 2-D problem (small MLP, CPU, no progress bars)."""
    from adni_pu import config as cfgmod
    from adni_pu.pu.config import TrainConfig

    base = {"model": "mlp6", "model_args": {"in_features": 2, "hidden": 16, "depth": 2},
            "epochs": 4, "batch_size": 128, "lr": 1e-2, "weight_decay": 0.0,
            "progress": False, "device": "cpu"}
    base.update(overrides)
    return cfgmod.from_dict(TrainConfig, base)


# Tests run beside other work on small machines: one thread avoids oversubscription.
torch.set_num_threads(1)


def allow_tiny_prior_estimates(patch: pytest.MonkeyPatch) -> None:
    """Let data of seconds (a few labelled validation positives, a 1-2 epoch classifier)
    give a class prior estimate: the minimum validation counts go down to 1 and a collapsed
    bootstrap interval is kept, so that the estimate's workflow can be tested (the rules
    themselves: tests/test_class_prior.py)."""
    from adni_pu.workflows import class_prior

    patch.setattr(class_prior, "MIN_LABELLED_VAL", 1)
    patch.setattr(class_prior, "MIN_UNLABELLED_VAL", 1)
    patch.setattr(class_prior, "collapse_reason", lambda record: None)


@pytest.fixture
def tiny_prior_estimates(monkeypatch):
    """:func:`allow_tiny_prior_estimates` for one test."""
    allow_tiny_prior_estimates(monkeypatch)


def tiny_mnist_benchmark(tmp_path: Path, monkeypatch) -> list[str]:
    """``adni-pu benchmark mnist`` arguments for one epoch on 200 MNIST-format images
    written under ``tmp_path`` (seconds)."""
    from test_readers import write_mnist

    from adni_pu.data import readers

    monkeypatch.setitem(readers.MNIST_COUNTS, "train", 200)
    monkeypatch.setitem(readers.MNIST_COUNTS, "test", 40)
    write_mnist(tmp_path / "mnist", n_train=200, n_test=40)
    return ["benchmark", "mnist", "--epochs", "1", "--n-labelled", "60", "--threads", "1",
            "--data-dir", str(tmp_path / "mnist"), "--out", str(tmp_path / "bm"),
            "--set", "progress=false"]


#: The default suite's longest tests (minutes each): started first, so that on two workers
#: (pyproject's ``-n 2``) they run beside the rest instead of after it.
LONGEST_FIRST = ("test_readme_own_data.py", "test_demo.py")


def pytest_collection_modifyitems(config, items):
    """Move the longest tests to the front; the order of the others is kept."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
