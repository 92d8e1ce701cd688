"""A synthetic MNIST: 28x28 uint8 images whose label is readable from them (learnable)."""

from __future__ import annotations

from typing import Any

import torch


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
