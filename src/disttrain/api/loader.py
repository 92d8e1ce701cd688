"""``run.loader``: torch's DataLoader over this rank's share, and where the data stands.

The position is counted in global batches *trained* (``run.step`` advances it), not
in batches the loader produced: torch's loader runs ahead by ``prefetch_factor x
num_workers`` batches. Map-style data resumes exactly, on any worker count: the next
loader of the saved epoch starts at the saved batch (:mod:`disttrain.data.torchloader`).
An ``IterableDataset`` has no position of ours: a resumed run restarts its epoch, and
says so in one line.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

__all__ = ["Position"]


@dataclass
class Position:
    """The epoch a run's data is in and the global batches of it trained."""

    epoch: int = 0
    batches: int = 0
    #: a resumed position not yet taken up by a loader of its epoch
    pending: bool = False

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.batches = int(state["epoch"]), int(state["batches"])
        self.pending = True

    def start(self, dataset: Any, epoch: int) -> int:
        """A loader of ``epoch`` begins: the global batches it skips (a resume's)."""
        skip = 0
        if self.pending and epoch == self.epoch:
            skip = self.batches
            if isinstance(dataset, IterableDataset) and skip:
                print(
                    f"disttrain: the IterableDataset has no position to resume from: epoch "
                    f"{epoch} starts again from its first batch",
                    file=sys.stderr,
                )
                skip = 0
        self.pending = False
        self.epoch, self.batches = epoch, skip
        return skip


def agreed(loader: Any, rank: int, group: Any) -> Iterator[Any]:
    """``loader``'s batches while every worker still has one (a stream's ranks may hold
    different numbers of batches at its end: the first to run out ends the epoch for all,
    so none waits in a collective for a batch that never comes); a line says how many of
    this rank's batches were left untrained."""
    import torch.distributed as dist

    from disttrain.data.torchloader import more_on_every_rank

    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        yield from loader
        return
    batches = iter(loader)
    while True:
        batch = next(batches, None)
        if not more_on_every_rank(batch is not None, group):
            break
        yield batch
    left = (batch is not None) + sum(1 for _ in batches)
    if left:
        print(
            f"disttrain: rank {rank}: another worker's stream ended first: {left} batch(es) "
            "of this rank's were not trained this epoch",
            file=sys.stderr,
        )


def rank_loader_for(
    dataset: Any,
    global_batch: int,
    rank: int,
    shards: int,
    seed: int,
    epoch: int,
    skip: int,
    **kwargs: Any,
) -> DataLoader:
    """torch's DataLoader of this rank's share (``data.torchloader.rank_loader``); a stream
    is never skipped into (its position is not ours)."""
    from disttrain.data.torchloader import rank_loader

    if isinstance(dataset, IterableDataset):
        return rank_loader(dataset, global_batch, rank, shards, epoch=epoch, seed=seed, **kwargs)
    return rank_loader(
        dataset, global_batch, rank, shards, epoch=epoch, seed=seed, skip=skip, **kwargs
    )
