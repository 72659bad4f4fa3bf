"""The GPU-speed engine, checked on the CPU: no per-batch host syncs, device augmentation,
bf16 autocast and channels-last within noise of fp32, and runs cut into timed pieces."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest
import torch
from conftest import tiny_config
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from adni_pu.data.benchmarks import crop_flip
from adni_pu.data.pu import make_pu_data
from adni_pu.pu import checkpoint, objective
from adni_pu.pu.trainer import Trainer

SP = {"warmup_epochs": 1, "self_paced_end": 2, "select_every": 1, "teacher_rampup_epochs": 1}
# Operators that make the host wait for the device (a value or a data-dependent shape).
SYNC_OPS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select",
            "aten::is_nonzero", "aten::equal", "aten::unique_consecutive", "aten::_unique2"}


class SyncSpy(TorchDispatchMode):
    """Counts the operators of SYNC_OPS (and indexing with boolean masks)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        name = func._schema.name
        if name in SYNC_OPS:
            self.calls.append(name)
        elif name.startswith("aten::index") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool
                for a in args if isinstance(a, (list, tuple)) for i in a):
            self.calls.append(name + "(bool mask)")
        return func(*args, **(kwargs or {}))


def _syncs_per_epoch(tiny_pu, batch_size: int, **cfg) -> list[list[str]]:
    trainer = Trainer(tiny_config(batch_size=batch_size, **cfg), tiny_pu)
    calls = []
    for epoch in range(cfg["epochs"]):
        trainer.strategy.epoch_start(epoch, {})  # Self-PU's selection, outside the count
        with SyncSpy() as spy:
            trainer.train_epoch(epoch)
        calls.append(spy.calls)
    return calls


@pytest.mark.filterwarnings("ignore:Seems like:UserWarning")
@pytest.mark.parametrize("settings", [
    {"method": "nnpu"},
    {"method": "selfpu", "selfpu": SP},
    {"method": "selfpu", "selfpu": {**SP, "labels": "entropy",
                                    "student_consistency": "per_batch"}},
    {"method": "selfpu", "positive_share": 0.25,
     "selfpu": {**SP, "rest_risk": "band", "reweight_risk": "mean-one"}},
])
def test_training_loop_never_waits_for_the_device(tiny_pu, monkeypatch, settings):
    # the teacher ramp is a host-side scalar (a CPU tensor even on a GPU run)
    monkeypatch.setattr(objective, "sigmoid_rampup", lambda epoch, length: 0.5)
    _mute_adam(monkeypatch)  # Adam reads its CPU step counter: not a device sync
    few = _syncs_per_epoch(tiny_pu, 256, epochs=3, **settings)
    many = _syncs_per_epoch(tiny_pu, 32, epochs=3, **settings)  # 8x the batches
    for a, b in zip(few, many):
        assert len(a) == len(b), (a, b)  # what syncs there are happen once per epoch
        assert len(b) <= 2, b


def test_crop_flip_is_a_seeded_crop_of_the_padded_mirror():
    x = torch.randn(64, 3, 8, 8)
    a = crop_flip(x, 2, torch.Generator().manual_seed(1))
    b = crop_flip(x, 2, torch.Generator().manual_seed(1))
    c = crop_flip(x, 2, torch.Generator().manual_seed(2))
    assert a.shape == x.shape
    assert torch.equal(a, b) and not torch.equal(a, c)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    flips = 0
    for i in range(len(x)):
        found = []
        for mirror in (False, True):
            src = padded[i].flip(-1) if mirror else padded[i]
            found += [mirror for r in range(5) for q in range(5)
                      if torch.equal(src[:, r:r + 8, q:q + 8], a[i])]
        assert found, i
        flips += found[0]
    assert 15 < flips < 49  # about half mirrored
    same = crop_flip(x, 0, torch.Generator())
    assert all(torch.equal(same[i], x[i]) or torch.equal(same[i], x[i].flip(-1))
               for i in range(len(x)))


def _tiny_images(n: int = 192, size: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.4).astype(np.int64)
    y[:30] = 1
    x = rng.normal(size=(n, 3, size, size)).astype(np.float32)
    x[:, 0, : size // 2] += 1.5 * (2 * y - 1)[:, None, None]
    return torch.from_numpy(x), y


@pytest.fixture
def tiny_images():
    x, y = _tiny_images()
    xt, yt = _tiny_images(64, seed=1)
    return make_pu_data(x, y, xt, yt, n_labelled=24, prior=0.4, val_fraction=0.25, seed=0)


def _cnn(**kw):
    return tiny_config(model="cnn13", model_args={"image_size": 8, "width": 4},
                       batch_size=32, lr=1e-3, **kw)


def _weights(trainer):
    return [v.clone() for st in trainer.state.students for v in st.model.state_dict().values()]


def test_crop_flip_training_is_reproducible(tiny_images):
    runs = [Trainer(_cnn(method="nnpu", epochs=1, augment=aug), tiny_images)
            for aug in ("crop-flip", "crop-flip", "none")]
    for t in runs:
        t.fit()
    w = [_weights(t) for t in runs]
    assert all(torch.equal(a, b) for a, b in zip(w[0], w[1]))
    assert not all(torch.equal(a, b) for a, b in zip(w[0], w[2]))


def test_channels_last_matches_the_default_layout(tiny_images):
    runs = [Trainer(_cnn(method="selfpu", epochs=3, selfpu=SP, channels_last=cl), tiny_images)
            for cl in (False, True)]
    for t in runs:
        t.fit()
    assert runs[1].state.students[0].model.features[0].weight.is_contiguous(
        memory_format=torch.channels_last)
    # the same computation in another memory order: losses equal up to rounding (which
    # Adam's normalised steps amplify a little over three epochs; counts of signs of
    # near-zero hypergradients, e.g. raw_positive_fraction, move more)
    for epoch, (a, b) in enumerate(zip(runs[0].state.history, runs[1].state.history)):
        for key, value in a.items():
            if key.endswith(("/loss", "/nnpu", "/trusted_ce", "/pu_risk")):
                rel = 1e-4 if epoch == 0 else 1e-2
                assert b[key] == pytest.approx(value, rel=rel, abs=1e-6), (epoch, key)
    for a, b in zip(_weights(runs[0]), _weights(runs[1])):
        torch.testing.assert_close(a, b, rtol=0.05, atol=5e-3)


def test_bf16_autocast_matches_fp32_within_seed_noise(tiny_pu):
    def accuracy(**kw):
        t = Trainer(tiny_config(method="nnpu", epochs=6, **kw), tiny_pu)
        t.fit()
        return t.evaluate_split(tiny_pu.test)[0]["accuracy"]

    fp32 = [accuracy(seed=s) for s in (0, 1, 2)]
    bf16 = accuracy(seed=0, amp=True)
    noise = max(fp32) - min(fp32)
    assert abs(bf16 - np.mean(fp32)) <= max(2 * noise, 0.02), (bf16, fp32)


def test_bf16_autocast_runs_selfpu_on_a_cnn(tiny_images):
    t = Trainer(_cnn(method="selfpu", epochs=3, selfpu=SP, amp=True, channels_last=True),
                tiny_images)
    fit = t.fit()
    assert [r["phase"] for r in fit.history] == [1, 2, 3]
    assert all(math.isfinite(v) for r in fit.history for k, v in r.items()
               if k.startswith("train/"))
    assert t.predict_logits(t.state.students[0].model, tiny_images.test).dtype == np.float32


def _fit_in_pieces(cfg, data, run, abort_mid_epoch: bool, monkeypatch) -> int:
    """Fit with a deadline that has always passed: one epoch per piece. Returns pieces."""
    if abort_mid_epoch:  # start every epoch, so the second one stops at its first batch
        monkeypatch.setattr(Trainer, "fits_before", lambda self, epoch, deadline: True)
    pieces = 0
    while True:
        pieces += 1
        fit = Trainer(cfg, data, run).fit(deadline=time.monotonic())
        if fit.complete:
            return pieces
        assert pieces < 20


@pytest.mark.parametrize("abort_mid_epoch", [False, True])
def test_run_cut_into_pieces_equals_uninterrupted(tiny_pu, tmp_path, monkeypatch,
                                                  abort_mid_epoch):
    cfg = tiny_config(method="selfpu", epochs=4, selfpu=SP, track_test=True)
    straight = Trainer(cfg, tiny_pu, tmp_path / "straight")
    straight.fit()
    pieces = _fit_in_pieces(cfg, tiny_pu, tmp_path / "pieces", abort_mid_epoch, monkeypatch)
    assert pieces == 4
    resumed = Trainer(cfg, tiny_pu, tmp_path / "pieces")
    checkpoint.resume(resumed.run, resumed.strategy.make_teachers)
    for a, b in zip(_weights(straight), _weights(resumed)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    strip = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in
             (straight.state.history, resumed.state.history) for r in r]
    assert json.dumps(strip[:4]) == json.dumps(strip[4:])  # NaN columns compare equal
    for name in ("metrics.csv", "best_model.pt", "selection.json"):
        assert (tmp_path / "pieces" / name).is_file()


def test_bf16_checkpoint_is_half_size_and_resumes(tiny_images, tmp_path):
    full = _cnn(method="selfpu", epochs=3, selfpu=SP)
    half = _cnn(method="selfpu", epochs=3, selfpu=SP, checkpoint_precision="bfloat16")
    Trainer(full, tiny_images, tmp_path / "full").fit()
    straight = Trainer(half, tiny_images, tmp_path / "straight")
    straight.fit()
    size = {n: (tmp_path / n / "checkpoints" / "last.pt").stat().st_size
            for n in ("full", "straight")}
    assert size["straight"] < 0.6 * size["full"]
    saved = torch.load(tmp_path / "straight" / "checkpoints" / "last.pt", weights_only=False)
    moments = saved["students"][0]["optimizer"]["state"][0]
    assert moments["exp_avg"].dtype == torch.bfloat16
    assert moments["step"].dtype == torch.float32  # counters keep their precision
    run = tmp_path / "pieces"
    while not Trainer(half, tiny_images, run).fit(deadline=time.monotonic()).complete:
        pass
    resumed = Trainer(half, tiny_images, run)
    checkpoint.resume(resumed.run, resumed.strategy.make_teachers)
    assert [p.dtype for p in resumed.state.students[0].model.parameters()][0] == torch.float32
    # each resume continues from rounded values: the losses follow the straight run closely
    for a, b in zip(straight.state.history, resumed.state.history):
        for key, value in a.items():
            if key.endswith(("/loss", "/pu_risk")):
                assert b[key] == pytest.approx(value, rel=0.05), key


def test_compiled_training_forward_is_wired_and_matches_eager(tiny_pu, monkeypatch):
    """``compile = true`` runs each student's training forward through torch.compile, and
    the losses equal eager ones. Fast: dynamo's ``eager`` backend (the graph is captured,
    no code is generated) stands in for inductor; the slow test below compiles for real."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    real = torch.compile
    wrapped: list[torch.nn.Module] = []

    def eager_compile(model, **kwargs):
        wrapped.append(model)
        return real(model, backend="eager", **kwargs)

    monkeypatch.setattr(torch, "compile", eager_compile)
    torch._dynamo.reset()
    counters.clear()
    runs = [Trainer(tiny_config(method="nnpu", epochs=2, compile=c), tiny_pu)
            for c in (False, True)]
    assert wrapped == [st.model for st in runs[1].state.students]
    for t in runs:
        t.fit()
    assert counters["stats"]["unique_graphs"] >= 1  # the forward ran as a captured graph
    for a, b in zip(runs[0].state.history, runs[1].state.history, strict=True):
        assert b["train/model/loss"] == pytest.approx(a["train/model/loss"], rel=1e-4)


@pytest.mark.slow
def test_compiled_training_forward_matches_eager(tiny_pu):
    """torch.compile (inductor on the CPU: about a minute of compilation)."""
    runs = [Trainer(tiny_config(method="nnpu", epochs=2, compile=c), tiny_pu)
            for c in (False, True)]
    for t in runs:
        t.fit()
    for a, b in zip(runs[0].state.history, runs[1].state.history):
        assert b["train/model/loss"] == pytest.approx(a["train/model/loss"], rel=1e-4)


class _Volumes(torch.utils.data.Dataset):
    """Tiny three-input volumes (map-style, as the MRI pipeline delivers them)."""

    def __init__(self, y: np.ndarray, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.items = [{"brain": torch.randn(1, 24, 24, 24, generator=g) + float(v),
                       "hipp_l": torch.randn(1, 16, 16, 16, generator=g) + float(v),
                       "hipp_r": torch.randn(1, 16, 16, 16, generator=g)} for v in y]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


def test_3d_cnn_trains_with_bf16_and_channels_last_3d():
    rng = np.random.default_rng(0)
    y = (rng.random(48) < 0.5).astype(np.int64)
    y[:12] = 1
    yt = np.r_[np.ones(8), np.zeros(8)].astype(np.int64)
    data = make_pu_data(_Volumes(y, 0), y, _Volumes(yt, 1), yt, n_labelled=10, prior=0.5,
                        val_fraction=0.25, seed=0)
    args = {"brain_size": 24, "hipp_size": 16, "channels": [4, 8], "hidden": 16}
    runs = [Trainer(tiny_config(method="nnpu", epochs=2, model="cnn3d", model_args=args,
                                batch_size=12, lr=1e-3, amp=fast, channels_last=fast), data)
            for fast in (False, True)]
    for t in runs:
        t.fit()
    conv = next(m for m in runs[1].state.students[0].model.modules()
                if isinstance(m, torch.nn.Conv3d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last_3d)
    for a, b in zip(runs[0].state.history, runs[1].state.history):
        assert b["train/model/loss"] == pytest.approx(a["train/model/loss"], rel=0.05)


def test_a_deadline_is_refused_with_distributed_training(tiny_pu):
    from adni_pu.distributed import DistributedRun

    trainer = Trainer(tiny_config(method="nnpu", epochs=1), tiny_pu,
                      distributed=DistributedRun(rank=0, world_size=2))  # as under torchrun
    with pytest.raises(ValueError, match="not supported with distributed training"):
        trainer.fit(deadline=time.monotonic() + 60)


def _mute_adam(monkeypatch) -> None:
    """Hide Adam from the dispatch modes: on the CPU it reads its step counters as host
    numbers (on a GPU the stack's Adam is fused and capturable, its counter on the device),
    and the stacked optimiser reads the members' counters once per epoch."""
    from adni_pu.pu import population

    step = torch.optim.Adam.step

    def quiet_step(self, *a, **k):
        with _disable_current_modes():
            return step(self, *a, **k)

    monkeypatch.setattr(torch.optim.Adam, "step", quiet_step)
    stacked = population._stacked_optimizer

    def quiet_stacked(*a, **k):
        with _disable_current_modes():
            return stacked(*a, **k)

    monkeypatch.setattr(population, "_stacked_optimizer", quiet_stacked)


@pytest.mark.filterwarnings("ignore:Seems like:UserWarning")
@pytest.mark.parametrize("settings", [{"method": "nnpu"}, {"method": "selfpu", "selfpu": SP}])
def test_population_step_never_waits_for_the_device(tiny_pu, monkeypatch, settings):
    """The stacked step of a population holds no host sync at all, the teacher ramp and
    the teachers' averaging rate included (a step a GPU can replay needs none)."""
    from adni_pu.pu import population

    _mute_adam(monkeypatch)
    counts = []
    for batch_size in (256, 32):
        trainers = [Trainer(tiny_config(batch_size=batch_size, epochs=3, seed=s, **settings),
                            tiny_pu) for s in (0, 1)]
        calls = []
        for epoch in range(3):
            for t in trainers:
                t.strategy.epoch_start(epoch, {})
            with SyncSpy() as spy:
                population.train_epoch(trainers, epoch)
            calls.append(spy.calls)
        counts.append(calls)
    assert counts == [[[], [], []], [[], [], []]], counts


def _described(value):
    """An operator argument as the graph would bake it in: a tensor by its shape, dtype and
    device, anything else (numbers, flags) by its value."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device)
    if isinstance(value, (list, tuple)):
        return tuple(_described(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _described(v)) for k, v in value.items()))
    return repr(value)


class OpLog(TorchDispatchMode):
    """Every operator with its arguments as :func:`_described` gives them."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if not func._schema.name.startswith("profiler::"):  # markers, not graph work
            self.ops.append((func._schema.name, _described(args), _described(kwargs or {})))
        return func(*args, **(kwargs or {}))


@pytest.mark.filterwarnings("ignore:Seems like:UserWarning")
@pytest.mark.parametrize("settings", [
    {"method": "nnpu"},
    {"method": "selfpu", "selfpu": SP},
    {"method": "selfpu", "selfpu": {**SP, "hypergradient": "jvp", "meta_sign_flip": True,
                                    "teacher_average": "uniform"}},
])
def test_population_step_is_the_same_at_every_batch(tiny_pu, monkeypatch, settings):
    """What lets a GPU capture the step once and replay it (adni_pu/pu/replay.py): within an
    epoch every batch issues the same operators with the same shapes and the same host
    numbers (a changing number, such as the teacher ramp or the averaging rate, lives in a
    device tensor), and no tensor is made from host values inside the step."""
    from adni_pu.pu import population, replay

    _mute_adam(monkeypatch)
    logs: list[list[tuple]] = []
    call = replay.StepReplay.__call__

    def logged(self, *inputs):
        with OpLog() as log:
            out = call(self, *inputs)
        logs.append(log.ops)
        return out

    monkeypatch.setattr(replay.StepReplay, "__call__", logged)
    trainers = [Trainer(tiny_config(batch_size=32, epochs=4, seed=s, **settings), tiny_pu)
                for s in (0, 1)]
    for epoch in range(4):
        for t in trainers:
            t.strategy.epoch_start(epoch, {})
        logs.clear()
        population.train_epoch(trainers, epoch)
        assert len(logs) > 2
        assert not [op for op in logs[0] if op[0] in ("aten::lift_fresh", *SYNC_OPS)]
        changed = [b for b, ops in enumerate(logs) if ops != logs[0]]
        assert not changed, (epoch, changed[:3], _first_difference(logs[0], logs[changed[0]]))


def _first_difference(a: list[tuple], b: list[tuple]) -> tuple:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i, x, y
    return len(a), len(a), len(b)
