"""A stream of uneven shards that keeps its place, as a reader of files does: the data of
the stream tests (tests/api/test_stream_resume.py, tests/data/test_stream_state.py).

Sample ``ident`` (0, 1, ...) comes from shard ``s`` at ``offset``; the place is the next
``(shard, offset)`` to read. :class:`StatefulShards` adds torchdata's ``Stateful``
protocol. A subclass sets ``lengths`` and says what a sample is (:meth:`Shards.item`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import torch

__all__ = ["Shards", "StatefulShards"]


class Shards(torch.utils.data.IterableDataset):
    """The shards' samples in order, from the place the stream is at."""

    lengths: ClassVar[list[int]] = []

    def __init__(self) -> None:
        self.shard, self.offset = 0, 0

    def item(self, ident: int) -> Any:
        return ident

    def __iter__(self) -> Iterator[Any]:
        start, skip, lengths = self.shard, self.offset, self.lengths
        ident = sum(lengths[:start]) + skip
        for shard in range(start, len(lengths)):
            for offset in range(skip if shard == start else 0, lengths[shard]):
                last = offset + 1 == lengths[shard]
                self.shard, self.offset = (shard + 1, 0) if last else (shard, offset + 1)
                yield self.item(ident)
                ident += 1
        self.shard, self.offset = 0, 0  # the next iteration is the next epoch's


class StatefulShards(Shards):
    """The same stream with torchdata's ``Stateful`` protocol."""

    def state_dict(self) -> dict[str, int]:
        return {"shard": self.shard, "offset": self.offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.shard, self.offset = int(state["shard"]), int(state["offset"])
