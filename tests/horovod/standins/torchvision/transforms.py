"""The transforms Horovod's examples use: Compose, ToTensor and Normalize (for the stand-in
MNIST's uint8 tensors and for PIL images), and the PIL crops, flip and resize of the
ImageNet example (torchvision's semantics, simplified: one random draw per crop)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from PIL import Image


class Compose:
    def __init__(self, steps: Sequence[Callable[[Any], Any]]) -> None:
        self.steps = list(steps)

    def __call__(self, x: Any) -> Any:
        for step in self.steps:
            x = step(x)
        return x


class ToTensor:
    """uint8 HxW -> float 1xHxW in [0, 1], as torchvision's does for a grey image; a PIL RGB
    image -> float 3xHxW in [0, 1]."""

    def __call__(self, x: Any) -> torch.Tensor:
        if isinstance(x, Image.Image):
            data = torch.frombuffer(bytearray(x.tobytes()), dtype=torch.uint8)
            return data.view(x.height, x.width, -1).permute(2, 0, 1).float().div(255)
        return x.unsqueeze(0).float().div(255)


class Normalize:
    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class RandomResizedCrop:
    """A random box of 8 %-100 % of the area and aspect 3/4-4/3, resized to size x size."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: Image.Image) -> Image.Image:
        w, h = image.size
        area = w * h * random.uniform(0.08, 1.0)
        aspect = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw = max(1, min(w, round(math.sqrt(area * aspect))))
        ch = max(1, min(h, round(math.sqrt(area / aspect))))
        left, top = random.randint(0, w - cw), random.randint(0, h - ch)
        box = (left, top, left + cw, top + ch)
        return image.resize((self.size, self.size), Image.Resampling.BILINEAR, box=box)


class RandomHorizontalFlip:
    def __call__(self, image: Image.Image) -> Image.Image:
        if random.random() < 0.5:
            return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return image


class Resize:
    """The shorter side to ``size``, keeping the aspect (torchvision's int form)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: Image.Image) -> Image.Image:
        w, h = image.size
        scale = self.size / min(w, h)
        return image.resize((round(w * scale), round(h * scale)), Image.Resampling.BILINEAR)


class CenterCrop:
    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, image: Image.Image) -> Image.Image:
        w, h = image.size
        left, top = (w - self.size) // 2, (h - self.size) // 2
        return image.crop((left, top, left + self.size, top + self.size))
