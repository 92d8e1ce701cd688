"""The allreduce interface, its cost statement, and the registry of algorithms by name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch.distributed import ProcessGroup

__all__ = ["ALGORITHMS", "AllReduceAlgorithm", "Cost", "all_reduce", "get", "register"]


@dataclass(frozen=True)
class Cost:
    """What one rank is expected to send for one allreduce: bytes and messages."""

    bytes_sent: int
    messages: int


class AllReduceAlgorithm(ABC):
    """An in-place elementwise sum over a process group."""

    name: ClassVar[str]

    @abstractmethod
    def all_reduce(self, tensor: torch.Tensor, group: ProcessGroup | None = None) -> torch.Tensor:
        """Sum ``tensor`` over ``group`` in place and return it."""

    @abstractmethod
    def cost(self, nbytes: int, world_size: int, rank: int = 0) -> Cost:
        """Bytes and messages ``rank`` sends for an ``nbytes`` tensor on ``world_size`` ranks."""


_REGISTRY: dict[str, AllReduceAlgorithm] = {}

#: The registered algorithm names, in registration order (filled on import).
ALGORITHMS: list[str] = []


def register(cls: type[AllReduceAlgorithm]) -> type[AllReduceAlgorithm]:
    """Class decorator: make an algorithm available by its ``name``."""
    _REGISTRY[cls.name] = cls()
    if cls.name not in ALGORITHMS:
        ALGORITHMS.append(cls.name)
    return cls


def get(name: str) -> AllReduceAlgorithm:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown allreduce algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}"
        ) from None


def all_reduce(
    tensor: torch.Tensor, algorithm: str = "native", group: ProcessGroup | None = None
) -> torch.Tensor:
    """Sum ``tensor`` in place over ``group`` with the named algorithm, and return it."""
    return get(algorithm).all_reduce(tensor, group)
