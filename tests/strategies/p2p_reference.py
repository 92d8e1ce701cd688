"""A deliberately simple point-to-point allreduce, registered only inside tests.

It exercises the reducer's communication-thread path (every non-native
algorithm runs there) before the real ring/tree/... algorithms are merged;
the tests then cover those too, through ``collectives.ALGORITHMS``.
"""

from __future__ import annotations

import torch
from torch.distributed import ProcessGroup

from disttrain.collectives.base import ALGORITHMS, AllReduceAlgorithm, Cost, register
from disttrain.comm import p2p

__all__ = ["NAME", "ShiftSum", "ensure_registered"]

NAME = "test-shift-sum"


class ShiftSum(AllReduceAlgorithm):
    """Pass whole tensors around the ring n-1 times and add what arrives (n-1 full sends)."""

    name = NAME

    def all_reduce(self, tensor: torch.Tensor, group: ProcessGroup | None = None) -> torch.Tensor:
        n, r = p2p.group_size(group), p2p.group_rank(group)
        passing = tensor.clone()
        incoming = torch.empty_like(tensor)
        for _ in range(n - 1):
            p2p.exchange(passing, (r + 1) % n, incoming, (r - 1) % n, group)
            tensor += incoming
            passing, incoming = incoming, passing
        return tensor

    def cost(self, nbytes: int, world_size: int, rank: int = 0) -> Cost:
        return Cost((world_size - 1) * nbytes, world_size - 1)


def ensure_registered() -> None:
    if NAME not in ALGORITHMS:
        register(ShiftSum)
