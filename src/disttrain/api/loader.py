"""``run.loader``: torch's DataLoader over this rank's share, and where the data stands.

The position is counted in global batches *trained* (``run.step`` advances it), not
in batches the loader produced: torch's loader runs ahead by ``prefetch_factor x
num_workers`` batches. Map-style data resumes exactly, on any worker count: the next
loader of the saved epoch starts at the saved batch (:mod:`disttrain.data.torchloader`).

An ``IterableDataset`` with ``state_dict`` / ``load_state_dict`` (torchdata's
``Stateful``) is read by torchdata's ``StatefulDataLoader``; ``run.state_dict()`` holds
every rank's loader state (:class:`Stream`, gathered by rank, plain values only), taken
between steps, when the loader has yielded exactly the batches trained (the ranks'
agreement, :func:`agreed`, asks for the next batch only when the loop does). The next
loader of the saved epoch continues it: on the same layout (ranks and ``num_workers``)
where each loader worker stood, on another layout with the samples left re-cut among the
new ranks and workers (:func:`~disttrain.data.torchloader.recut`), so each sample of the
epoch is trained once either way. A stream that splits itself by rank resumes on its
saved layout only; elsewhere, and for a stream without a state, the epoch starts again,
and one line says so.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

__all__ = ["Position", "Stream"]


@dataclass
class Position:
    """The epoch a run's data is in and the global batches of it trained."""

    epoch: int = 0
    batches: int = 0
    #: a resumed position not yet taken up by a loader of its epoch
    pending: bool = False
    #: a loaded state's stream: every rank's :meth:`Stream.state` in that epoch, by rank
    saved: list[dict[str, Any]] | None = None

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches": self.batches}

    def load_state_dict(self, state: dict[str, Any], stream: dict[str, Any] | None = None) -> None:
        """Go on from ``state``; ``stream`` (``run.state_dict()["stream"]``) is the
        stream's place in that epoch, when it has one."""
        self.epoch, self.batches = int(state["epoch"]), int(state["batches"])
        self.pending = True
        self.saved = None
        if stream is not None and int(stream["epoch"]) == self.epoch:
            # by data shard: the processes of one shard (model parallel) read alike
            first: dict[int, dict[str, Any]] = {}
            for part in stream["ranks"]:
                first.setdefault(int(part["shard"]), part)
            self.saved = [first[k] for k in sorted(first)]

    def start(self, dataset: Any, epoch: int, shards: int = 1, workers: int = 0) -> Any:
        """A loader of ``epoch`` begins: what it resumes from. Map-style: the global
        batches it skips. A stream: every rank's saved loader state, ``OVER`` (the saved
        epoch's stream had ended) or None (from its first batch: a fresh epoch, or one
        that cannot be resumed, said in one line)."""
        resumes = self.pending and epoch == self.epoch and self.batches > 0
        saved, self.saved, self.pending = self.saved, None, False
        if not resumes:
            self.epoch, self.batches = epoch, 0
            return None if isinstance(dataset, IterableDataset) else 0
        if not isinstance(dataset, IterableDataset):
            return self.batches
        from disttrain.data.torchloader import is_stateful, resume_refused

        if saved is not None and any(r["over"] for r in saved):
            return OVER
        why: str | None
        if not is_stateful(dataset):
            why = "the IterableDataset has no position to resume from"
        elif saved is None:
            why = "the state holds no place of the stream in this epoch"
        else:
            why = resume_refused(dataset, saved, shards, workers)
        if why is None:
            return saved
        print(f"disttrain: {why}: epoch {epoch} starts again from its first batch", file=sys.stderr)
        self.batches = 0
        return None


#: :meth:`Position.start`'s answer for a stream whose saved epoch had already ended
OVER = "over"


class Stream:
    """A stateful stream's loader (torchdata's ``StatefulDataLoader``) in this rank's
    epoch, read through the ranks' agreement, and its part of ``run.state_dict()``."""

    def __init__(self, loader: Any, shard: int, workers: int, over: bool = False) -> None:
        self.loader, self.shard, self.workers = loader, shard, workers
        self.over = over  # the ranks agreed that the epoch's stream has ended

    def batches(self, rank: int, group: Any) -> Iterator[Any]:
        yield from agreed(self.loader, rank, group)
        self.over = True

    def state(self) -> dict[str, Any]:
        """This rank's loader state, plain values only (``data.torchloader.stream_state``)."""
        from disttrain.data.torchloader import stream_state

        mine = {"shard": self.shard, "over": self.over}
        if self.over:  # nothing left of the epoch: no loader state to carry
            return {**mine, "workers": self.workers, "loader": None}
        return {**mine, **stream_state(self.loader, self.workers)}


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
    skip: Any,
    **kwargs: Any,
) -> DataLoader:
    """torch's DataLoader of this rank's share (``data.torchloader.rank_loader``); a stream
    is never skipped into: ``skip`` is then every rank's saved loader state, or None."""
    from disttrain.data.torchloader import rank_loader

    if isinstance(dataset, IterableDataset):
        return rank_loader(
            dataset, global_batch, rank, shards, epoch=epoch, seed=seed, resume=skip, **kwargs
        )
    return rank_loader(
        dataset, global_batch, rank, shards, epoch=epoch, seed=seed, skip=skip, **kwargs
    )
