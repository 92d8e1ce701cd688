"""Compose, ToTensor and Normalize for the stand-in's uint8 tensors (no PIL)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


class Compose:
    def __init__(self, steps: Sequence[Callable[[Any], Any]]) -> None:
        self.steps = list(steps)

    def __call__(self, x: Any) -> Any:
        for step in self.steps:
            x = step(x)
        return x


class ToTensor:
    """uint8 HxW -> float 1xHxW in [0, 1], as torchvision's does for a grey image."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(0).float().div(255)


class Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std
