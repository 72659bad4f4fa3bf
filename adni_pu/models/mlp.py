"""The 6-layer MLP of nnPU and Self-PU for MNIST: 784-300-300-300-300-1."""

from __future__ import annotations

import torch
from torch import nn

from adni_pu.errors import ConfigError


class MLP(nn.Module):
    """Hidden layers are Linear(no bias) - BatchNorm - ReLU; the last Linear has a bias."""

    def __init__(self, in_features: int = 784, hidden: int = 300, depth: int = 4) -> None:
        super().__init__()
        if depth < 1 or hidden < 1 or in_features < 1:
            raise ConfigError(f"MLP sizes must be positive: in={in_features} hidden={hidden} "
                             f"depth={depth}")
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden, bias=False), nn.BatchNorm1d(hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)
        self.in_features = in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One logit per example (shape B)."""
        return self.net(x.reshape(x.shape[0], -1)).squeeze(-1)
