"""A synthetic MNIST (28x28 uint8 images whose label is readable from them: learnable) and
an ImageFolder that reads what the test writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from PIL import Image


class MNIST(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(
        self, root: str, train: bool = True, download: bool = False, transform: Any = None
    ) -> None:
        g = torch.Generator().manual_seed(0 if train else 1)
        n = 256 if train else 128
        self.targets = torch.randint(0, 10, (n,), generator=g)
        noise = torch.randint(0, 60, (n, 28, 28), generator=g)
        rows = torch.arange(28).view(1, 28, 1)
        bright = (rows // 3 == self.targets.view(n, 1, 1)).expand(n, 28, 28)  # a bright band
        self.data = (noise + 190 * bright).to(torch.uint8)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        image: Any = self.data[i]
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.targets[i])


class ImageFolder(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """torchvision's layout: ``root/<class>/<image>``, classes in sorted order, each image
    opened with PIL as RGB (the test writes a small synthetic folder with PIL)."""

    def __init__(self, root: str, transform: Any = None) -> None:
        base = Path(root)
        self.classes = sorted(p.name for p in base.iterdir() if p.is_dir())
        self.samples = [
            (str(f), label)
            for label, name in enumerate(self.classes)
            for f in sorted((base / name).iterdir())
        ]
        self.targets = [label for _, label in self.samples]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        path, label = self.samples[i]
        with Image.open(path) as f:
            image: Any = f.convert("RGB")
        if self.transform is not None:
            image = self.transform(image)
        return image, label
