"""Models by name, so a settings file can say ``model = "mlp6"``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from adni_pu.errors import ConfigError


def _mlp6(**kw: Any) -> nn.Module:
    from adni_pu.models.mlp import MLP

    return MLP(**kw)


def _cnn13(**kw: Any) -> nn.Module:
    from adni_pu.models.cnn13 import CNN13

    return CNN13(**kw)


def _cnn3d(**kw: Any) -> nn.Module:
    from adni_pu.models.cnn3d import build_cnn3d

    return build_cnn3d(**kw)


_REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "mlp6": _mlp6,
    "cnn13": _cnn13,
    "cnn3d": _cnn3d,
}


def available_models() -> list[str]:
    """Names accepted by :func:`build_model`."""
    return sorted(_REGISTRY)


def build_model(name: str, **kwargs: Any) -> nn.Module:
    """Build the model registered as ``name`` with its keyword arguments."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"model {name!r}: expected one of {available_models()}") from None
    return factory(**kwargs)
