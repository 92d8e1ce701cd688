"""A small convolutional network for square one-channel images (digits' 8x8)."""

from __future__ import annotations

import math

import torch
from torch import nn

from disttrain.comm.errors import UsageError
from disttrain.data.datasets import Dataset
from disttrain.models.base import MODELS, needs_classification

__all__ = ["cnn"]


class _ToImage(nn.Module):
    """Reshape flat features (N, side*side) to one-channel images (N, 1, side, side)."""

    def __init__(self, side: int) -> None:
        super().__init__()
        self.side = side

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], 1, self.side, self.side)


def cnn(in_features: int, num_classes: int) -> nn.Sequential:
    """conv3x3(32) - conv3x3(64) - maxpool2 - fc(128) - fc(classes): 0.17M parameters on 8x8."""
    side = math.isqrt(in_features)
    if side * side != in_features or side < 2:
        raise UsageError(
            f"--model cnn needs square one-channel images; {in_features} features are not a square"
        )
    pooled = side // 2
    return nn.Sequential(
        _ToImage(side),
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * pooled * pooled, 128),
        nn.ReLU(),
        nn.Linear(128, num_classes),
    )


@MODELS.register("cnn")
def _cnn(data: Dataset) -> nn.Module:
    needs_classification("cnn", data)
    return cnn(data.in_features, data.num_classes)
