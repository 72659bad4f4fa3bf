"""Benchmark models and the registry."""

from __future__ import annotations

import pytest
import torch

from adni_pu.models import available_models, build_model


def test_mlp6_shape_and_layers():
    model = build_model("mlp6")
    out = model(torch.randn(5, 1, 28, 28))
    assert out.shape == (5,)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [
        (784, 300), (300, 300), (300, 300), (300, 300), (300, 1)]
    assert all(m.bias is None for m in linears[:-1]) and linears[-1].bias is not None


def test_cnn13_shape():
    model = build_model("cnn13")
    model.eval()
    assert model(torch.randn(2, 3, 32, 32)).shape == (2,)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 9
    assert [c.out_channels for c in convs] == [96, 96, 96, 192, 192, 192, 192, 192, 10]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [
        (640, 1000), (1000, 1000), (1000, 1)]


def test_registry_refuses_unknown_name():
    assert {"mlp6", "cnn13", "cnn3d"} <= set(available_models())
    with pytest.raises(ValueError, match="model 'resnet': expected one of"):
        build_model("resnet")
