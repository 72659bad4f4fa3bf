"""``--device`` and ``train.device`` (adni_pu.pu.device_data.resolve_device): CUDA on a
machine without it and an unknown device are one line, exit 2, before any folder is made."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from adni_pu.cli.app import app
from adni_pu.errors import DeviceError

runner = CliRunner()



@pytest.fixture
def no_cuda(monkeypatch):
    """This machine as one without CUDA, whatever it has."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)


@pytest.mark.parametrize("args", [
    ["evaluate", "RUN", "--device", "cuda"],
    ["predict", "RUN", "scan.nii", "--device", "cuda"],
    ["benchmark", "mnist", "--out", "OUT", "--device", "cuda"],
    ["train", "m.csv", "RUN", "--set", 'train.device="cuda"'],
])
def test_cuda_on_a_machine_without_it_is_one_line(tmp_path: Path, no_cuda, args) -> None:
    args = [str(tmp_path / a) if a in ("RUN", "OUT") else a for a in args]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    line = result.output.strip()
    assert "\n" not in line and line.startswith("error: ")
    assert "cuda: CUDA is not available on this machine (torch " in line
    assert "built without CUDA" in line and "cpu" in line
    assert not (tmp_path / "RUN").exists() and not (tmp_path / "OUT").exists()


@pytest.mark.parametrize("args", [["evaluate", "RUN", "--device", "tpu"],
                                  ["benchmark", "mnist", "--out", "OUT", "--device", "tpu"]])
def test_an_unknown_device_is_one_line(tmp_path: Path, args) -> None:
    result = runner.invoke(app, [str(tmp_path / a) if a in ("RUN", "OUT") else a for a in args])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == ("error: --device 'tpu': expected auto, cpu, cuda, cuda:N "
                                     "(N: the GPU's number) or mps")


def test_device_resolution(no_cuda) -> None:
    from adni_pu.pu.device_data import resolve_device

    assert resolve_device("auto").type == "cpu" and resolve_device("CPU").type == "cpu"
    for bad in ("cuda:", "cuda:x", "gpu", ""):
        with pytest.raises(DeviceError, match="expected auto, cpu, cuda"):
            resolve_device(bad)
    with pytest.raises(DeviceError, match='use train.device="cpu" or auto'):
        resolve_device("cuda:0", "train.device")
