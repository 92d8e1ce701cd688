"""Horovod's ``hvd.elastic.ElasticSampler``: shards a dataset over the ranks and, after a
reset, shards only what this epoch has not processed yet, over the world as it is then.

The epoch's order is every index of the dataset shuffled with ``random.Random(seed +
epoch)`` (Horovod 0.28's choice, so the same script sees the same samples in the same
order). What is left is that order without the processed indices; rank ``r`` takes
positions ``r, r + R, r + 2R, ...`` of it (``R`` ranks), the end padded by wrapping to
the start, as ``DistributedSampler`` does, so every rank has as many samples.

Processed samples are kept as a set of indices, which holds both of Horovod's ways of
recording them: ``record_batch`` (0.28: batch ``i`` of this pass is done on *every*
rank; computed here without communication, since each rank knows every rank's shard)
and ``record_indices`` (Horovod 0.21: this rank's own indices; the ranks' sets are
joined when the state commits, :mod:`disttrain.horovod.elastic.state`). A set rather than
0.28's count: recorded indices need not be a prefix of the order.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import torch.utils.data

from disttrain.horovod import basics

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler[int]):
    """Shards ``dataset`` over the ranks, skipping what this epoch already processed.

    ``num_replicas``/``rank`` (ours, keyword only): a fixed world instead of ``hvd.size()``
    and ``hvd.rank()``, read again at every :meth:`reset` (tests, tools without a job).
    Call :meth:`record_batch` after each batch and :meth:`set_epoch` at the *end* of each
    epoch (it forgets the processed indices), as Horovod asks.
    """

    def __init__(
        self,
        dataset: Sized,
        shuffle: bool = True,
        seed: int = 0,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self._fixed = (num_replicas, rank)
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.indices: list[int] = []  # this rank's share of the current pass (Horovod's name)
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    @property
    def processed_num(self) -> int:
        """How many distinct samples this epoch has processed (0.28's counter)."""
        return len(self.processed_indices)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``: a new order, nothing processed (call it at the end of an epoch)."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Batch ``batch_idx`` of this pass is processed on every rank (all step together)."""
        for r in range(self.num_replicas):
            self.processed_indices.update(self._batch(r, batch_idx, batch_size))

    def record_indices(self, indices: Iterable[int]) -> None:
        """This rank processed ``indices`` (joined with the other ranks' at commit)."""
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """This rank's indices of batch ``batch_idx`` of this pass."""
        return self._batch(self.rank, batch_idx, batch_size)

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "processed_indices": set(self.processed_indices),
            "processed_num": self.processed_num,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take a state; Horovod 0.28's (``processed_num``: a prefix of the order) too."""
        self.epoch = int(state_dict["epoch"])
        if "processed_indices" in state_dict:
            self.processed_indices = {int(i) for i in state_dict["processed_indices"]}
        else:
            self.processed_indices = set(self._order()[: int(state_dict["processed_num"])])
        self.reset()

    def reset(self) -> None:
        """Re-shard what is left of the epoch over the world as it is now."""
        fixed_size, fixed_rank = self._fixed
        self.num_replicas = basics.size() if fixed_size is None else fixed_size
        self.rank = basics.rank() if fixed_rank is None else fixed_rank
        if not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank {self.rank} is not in a world of {self.num_replicas}")
        done = self.processed_indices
        self.remaining_indices = [i for i in self._order() if i not in done]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self.indices = self._batch(self.rank, 0, self.num_samples)

    def _order(self) -> list[int]:
        """The epoch's order of every index: the same on every rank and after any reset,
        so that what is left after a reset is still in the order the epoch began with."""
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def _batch(self, rank: int, batch_idx: int, batch_size: int) -> list[int]:
        """Positions ``[batch_idx * batch_size, ...)`` of ``rank``'s shard. Position ``j``
        of rank ``r`` is ``j * R + r`` of what is left, wrapped at its end (padding); no
        shard is built, so recording a batch costs its size, not the dataset's."""
        left = self.remaining_indices
        start = batch_idx * batch_size
        stop = min(start + batch_size, self.num_samples)
        return [left[(j * self.num_replicas + rank) % len(left)] for j in range(start, stop)]

    def __iter__(self) -> Iterator[int]:
        self.indices = self._batch(self.rank, 0, self.num_samples)
        return iter(list(self.indices))

    def __len__(self) -> int:
        return self.num_samples
