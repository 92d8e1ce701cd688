"""A multi-layer perceptron; the default (6.4M parameters) makes communication matter."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from disttrain.data.datasets import Dataset
from disttrain.models.base import MODELS, needs_classification

__all__ = ["DEFAULT_HIDDEN", "mlp"]

#: 64 -> 2048 -> 2048 -> 1024 -> 10 on digits: 6.43M parameters, 25.7 MB of fp32 gradients.
DEFAULT_HIDDEN = (2048, 2048, 1024)


def mlp(
    in_features: int, num_classes: int, hidden: Sequence[int] = DEFAULT_HIDDEN
) -> nn.Sequential:
    """``nn.Sequential`` of Flatten, then Linear+ReLU per hidden width, then a Linear head."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_features
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


@MODELS.register("mlp")
def _mlp(data: Dataset) -> nn.Module:
    needs_classification("mlp", data)
    return mlp(data.in_features, data.num_classes)
