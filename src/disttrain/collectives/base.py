"""The allreduce interface, its cost statement, and the registry of algorithms by name.

Every algorithm is an in-place elementwise sum over a process group. The shared
work lives here (a template method): flatten the tensor, skip the trivial cases
(one rank, zero elements), check that all ranks pass the same length, then hand a
flat contiguous view to the algorithm's :meth:`AllReduceAlgorithm.reduce_flat`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.collectives.checks import check_call

__all__ = [
    "ALGORITHMS",
    "AllReduceAlgorithm",
    "Cost",
    "all_reduce",
    "get",
    "length_check_enabled",
    "register",
    "set_length_check",
]


@dataclass(frozen=True)
class Cost:
    """What one rank is expected to send for one allreduce: bytes and messages."""

    bytes_sent: int
    messages: int

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.bytes_sent + other.bytes_sent, self.messages + other.messages)


_check = [True]


def set_length_check(enabled: bool) -> bool:
    """Turn the cross-rank length check on or off for every algorithm; return the old value.

    On by default: gloo silently accepts a *shorter* message than the receive
    buffer and aborts the whole process (SIGABRT) on a *longer* one, so a
    length mismatch would otherwise corrupt data or crash. The check costs one
    32-byte native allreduce per call (see docs/collectives.md for its time); it
    also checks that every rank calls the same algorithm on the same dtype.
    """
    old = _check[0]
    _check[0] = enabled
    return old


def length_check_enabled() -> bool:
    return _check[0]


class AllReduceAlgorithm(ABC):
    """An in-place elementwise sum over a process group."""

    name: ClassVar[str]

    def all_reduce(self, tensor: torch.Tensor, group: ProcessGroup | None = None) -> torch.Tensor:
        """Sum ``tensor`` over ``group`` in place and return it."""
        n = dist.get_world_size(group)
        if n == 1:
            return tensor
        if _check[0]:
            check_call(f"allreduce/{self.name}/{tensor.dtype}", tensor.numel(), group)
        if tensor.numel() == 0:
            return tensor
        if tensor.is_contiguous():
            self.reduce_flat(tensor.view(-1), group)
        else:  # work on a contiguous copy; the result is copied back in place
            flat = tensor.contiguous().view(-1)
            self.reduce_flat(flat, group)
            tensor.copy_(flat.view_as(tensor))
        return tensor

    @abstractmethod
    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        """Sum the non-empty 1-D contiguous ``flat`` over ``group`` (of two or more ranks)."""

    @abstractmethod
    def cost(self, nbytes: int, world_size: int, rank: int = 0, itemsize: int = 1) -> Cost:
        """Bytes and messages group rank ``rank`` sends for ``nbytes`` on ``world_size`` ranks.

        ``itemsize`` is the element size: algorithms split the tensor between
        elements, so chunk sizes (and hence the exact bytes) depend on it. The
        cost excludes the optional length check (:func:`checks.check_cost`).
        """


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
