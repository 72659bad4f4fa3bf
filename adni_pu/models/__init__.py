"""Networks: the MLP and 13-layer CNN of the benchmarks, the 3-branch 3D CNN, a registry."""

from adni_pu.models.registry import available_models, build_model

__all__ = ["available_models", "build_model"]
