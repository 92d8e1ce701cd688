"""Tiny image classifiers under torchvision's model names (1000 classes, any image size)."""

from __future__ import annotations

from torch import nn


def _tiny(num_classes: int = 1000) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, kernel_size=7, stride=8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, num_classes),
    )


def resnet50(num_classes: int = 1000) -> nn.Module:
    return _tiny(num_classes)


def resnet18(num_classes: int = 1000) -> nn.Module:
    return _tiny(num_classes)
