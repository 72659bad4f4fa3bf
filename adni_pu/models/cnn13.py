"""The 13-layer CNN of nnPU and Self-PU for CIFAR-10."""

from __future__ import annotations

import torch
from torch import nn


def _conv(cin: int, cout: int, k: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False),
            nn.BatchNorm2d(cout), nn.ReLU()]


class CNN13(nn.Module):
    """3x3 conv 96, 96, 96/2, 192, 192, 192/2, 192, 1x1 192, 1x1 10 (each conv-BN-ReLU),
    flatten (10 x 8 x 8 = 640), FC 1000, FC 1000, FC 1."""

    def __init__(self, in_channels: int = 3, image_size: int = 32, width: int = 96) -> None:
        super().__init__()
        w1, w2 = width, 2 * width
        self.features = nn.Sequential(
            *_conv(in_channels, w1, 3), *_conv(w1, w1, 3), *_conv(w1, w1, 3, stride=2),
            *_conv(w1, w2, 3), *_conv(w2, w2, 3), *_conv(w2, w2, 3, stride=2),
            *_conv(w2, w2, 3), *_conv(w2, w2, 1), *_conv(w2, 10, 1),
        )
        side = image_size // 4
        self.classifier = nn.Sequential(
            nn.Linear(10 * side * side, 1000), nn.BatchNorm1d(1000), nn.ReLU(),
            nn.Linear(1000, 1000), nn.BatchNorm1d(1000), nn.ReLU(),
            nn.Linear(1000, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One logit per example (shape B)."""
        return self.classifier(self.features(x).flatten(1)).squeeze(-1)
