"""A step replayed as a CUDA graph: eager without capture; with it, every call one real step
(the capture call included), new inputs seen by each replay, outputs copied out, and a
changed input refused. The population's captured training is in tests/test_population.py."""

from __future__ import annotations

import pytest
import torch

from adni_pu.pu.replay import StepReplay


def _counter(device: str):
    total = torch.zeros(3, device=device)

    def step(x: torch.Tensor, extra: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        total.add_(x * extra["scale"])
        return {"total": total * 1.0, "sum": x.sum()}

    return total, step


def test_without_capture_the_step_runs_as_called():
    total, step = _counter("cpu")
    replay = StepReplay(step)
    for k in range(4):
        out = replay(torch.full((3,), float(k)), {"scale": torch.tensor(2.0)})
    assert total.tolist() == [12.0] * 3 and out["sum"].item() == 9.0
    assert replay.graph is None and replay.calls == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_a_captured_step_replays_each_call_with_its_own_inputs():
    total, step = _counter("cuda")
    replay = StepReplay(step, capture=True, warmup=2)
    outs = [replay(torch.full((3,), float(k), device="cuda"),
                   {"scale": torch.tensor(2.0, device="cuda")}) for k in range(6)]
    assert replay.graph is not None
    assert total.tolist() == [30.0] * 3  # 2 x (0 + 1 + ... + 5): every call stepped once
    assert [o["sum"].item() for o in outs] == [0.0, 3.0, 6.0, 9.0, 12.0, 15.0]
    assert outs[3]["total"].tolist() == [12.0] * 3  # copied out, not overwritten later
    with pytest.raises(ValueError, match="changed shape"):
        replay(torch.ones(4, device="cuda"), {"scale": torch.tensor(2.0, device="cuda")})
    with pytest.raises(ValueError, match="changed shape, dtype or device"):
        replay(torch.ones(3, device="cuda", dtype=torch.float64),
               {"scale": torch.tensor(2.0, device="cuda")})
    with pytest.raises(ValueError, match="changed structure"):
        replay(torch.ones(3, device="cuda"), {"other": torch.tensor(2.0, device="cuda")})
