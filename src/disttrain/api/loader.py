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

A stream's ranks read through their agreement (:func:`agreed`,
:class:`~disttrain.data.tail.EvenEnd`): while every rank has a batch they train it; at
the first step one has none, what the others still hold is drained and dealt out evenly,
so every sample is trained once and every data shard takes the same number of steps
(the module docstring of :mod:`disttrain.data.tail` says why this design). A state
taken between two of those last steps resumes exactly: the loader is spent then, and
each rank's part of the state holds its shard's dealt batches not yet trained (tensors,
``"tail"``); a run on as many data shards trains each shard's own, on another number
they are dealt again among the new shards (:class:`SavedTail`), on any layout, a stream
that splits itself included.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from disttrain.comm.errors import UsageError

__all__ = ["Leftover", "Position", "SavedTail", "Stream"]


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
        batches it skips. A stream: every rank's saved loader state, a
        :class:`SavedTail` (saved in the epoch's dealt tail), ``OVER`` (the saved
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
            # every shard's untrained part of a dealt tail, or nothing: the stream had ended
            parts = [list(r.get("tail") or []) for r in saved]
            return SavedTail(parts) if any(parts) else OVER
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
        self.end: Any = None  # what is read: the agreement and its dealt tail, or a saved tail

    def batches(self, rank: int, group: Any) -> Iterator[Any]:
        self.end = self.loader if isinstance(self.loader, Leftover) else None
        if self.end is None:
            self.end = _agreement(self.loader, self.shard, group)
        yield from self.end
        self.over = True

    def state(self) -> dict[str, Any]:
        """This rank's loader state, plain values only (``data.torchloader.stream_state``);
        in the epoch's dealt tail, the loader is spent and ``"tail"`` holds this shard's
        batches of it not yet trained (tensors)."""
        from disttrain.data.torchloader import stream_state

        mine = {"shard": self.shard, "over": self.over}
        left = getattr(self.end, "left", None)
        if self.over or left is not None:  # no loader state to carry: its stream is spent
            tail = list(left) if left is not None else []
            return {**mine, "over": True, "workers": self.workers, "loader": None, "tail": tail}
        return {**mine, **stream_state(self.loader, self.workers)}


class Leftover:
    """A saved tail's rest, dealt anew among this run's data shards: this shard's batches
    of it, the last of the saved epoch (``left``: those not yet handed over)."""

    def __init__(self, batches: list[Any]) -> None:
        self.left = deque(batches)

    def __iter__(self) -> Iterator[Any]:
        while self.left:
            yield self.left.popleft()


@dataclass
class SavedTail:
    """A state taken in a stream's dealt tail: each saved data shard's batches of it not
    yet trained, by shard (:meth:`Position.start`'s answer; :func:`rank_loader_for`
    hands this shard its part)."""

    parts: list[list[Any]]

    def leftover(self, shard: int, shards: int, per_batch: int) -> Leftover:
        """Shard ``shard`` of ``shards``'s part: on as many shards as were saved, its own
        batches (the uninterrupted epoch's); else the rows joined and dealt as the live
        tail is (:func:`~disttrain.data.tail.deal`), alike on every rank, no collective."""
        from disttrain.data.tail import deal, join, pieces_of

        if len(self.parts) == shards:
            return Leftover(self.parts[shard])
        joined = join([b for part in self.parts for b in part])
        if isinstance(joined, str):  # dealt from one joined tensor each: cannot differ
            raise UsageError(f"the saved state's stream tail cannot be read: {joined}")
        spec, leaves, rows = joined
        plan = deal(rows, shards, per_batch)
        if plan.used < rows and shard == 0:
            print(
                f"disttrain: a stream's last {rows - plan.used} sample(s) were not trained "
                f"this epoch: too few to give each of {shards} data shards one",
                file=sys.stderr,
            )
        return Leftover(pieces_of(spec, leaves, plan.pieces[shard]))


def _agreement(loader: Any, shard: int, group: Any) -> Any:
    """``loader`` read through the ranks' agreement and its dealt tail
    (:class:`~disttrain.data.tail.EvenEnd`); the loader itself on one process."""
    import torch.distributed as dist

    from disttrain.data.tail import EvenEnd

    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return loader
    return EvenEnd(loader, shard, group, int(loader.batch_size))


def agreed(loader: Any, rank: int, group: Any, shard: int | None = None) -> Iterator[Any]:
    """``loader``'s batches while every worker still has one, then this rank's part of the
    stream's rest, dealt evenly (:mod:`disttrain.data.tail`): every data shard steps the
    same number of times and none waits in a collective for a batch that never comes.
    ``shard``: this rank's data shard (None: the rank split's, else its rank in
    ``group``); ``rank`` is the caller's, the notice of samples not trained is the
    group's, said once."""
    del rank
    if shard is None:
        shard = _shard_of(loader, group)
    yield from _agreement(loader, shard, group)


def _shard_of(loader: Any, group: Any) -> int:
    """The data shard a stream's loader reads: its rank split's (model-parallel peers
    share it), else this process's rank in ``group``."""
    import torch.distributed as dist

    from disttrain.data.torchloader import RankSplit

    split = getattr(loader, "dataset", None)
    if isinstance(split, RankSplit):
        return split.rank
    return dist.get_rank(group) if dist.is_initialized() else 0


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
    is never skipped into: ``skip`` is then every rank's saved loader state, or None; a
    :class:`SavedTail` gives this shard's part of it instead of a loader."""
    from disttrain.data.torchloader import rank_loader

    if isinstance(skip, SavedTail):
        return skip.leftover(rank, shards, global_batch // shards)  # type: ignore[return-value]
    if isinstance(dataset, IterableDataset):
        return rank_loader(
            dataset, global_batch, rank, shards, epoch=epoch, seed=seed, resume=skip, **kwargs
        )
    return rank_loader(
        dataset, global_batch, rank, shards, epoch=epoch, seed=seed, skip=skip, **kwargs
    )
