"""torch's own ``DataLoader`` for one rank of a data-parallel job.

Worker processes, ``pin_memory``, ``prefetch_factor``, ``collate_fn`` and every other
``DataLoader`` keyword are torch's; this module only decides which samples a rank takes.

Map-style data (``__len__`` and ``__getitem__``) keeps the global-batch rule of
:class:`~disttrain.data.sampler.GlobalBatchSampler`: step t of rank r of N holds the
r-th contiguous slice of B/N indices of global batch t of the epoch's permutation,
drawn from (seed, epoch). So N ranks at global batch B see, step by step, the samples
one process sees at B.

Iterable data (``torch.utils.data.IterableDataset``) is split by rank and by loader
worker: the pair k = rank * W + worker (W = max(num_workers, 1)) takes the samples
whose running index i in the stream has ``i % (N * W) == k``. A dataset that splits
itself says so (:class:`SplitsByRank`) and is left alone. Ranks may hold different
numbers of batches at the end: a rank that ran out simply yields nothing more, and
the caller makes the ranks agree with :func:`more_on_every_rank`.

Positions, for a resume:

- map-style: ``(epoch, global batches trained in that epoch)``. The caller counts the
  steps it has *trained*, not the batches the loader produced (the loader runs ahead
  by ``prefetch_factor * num_workers`` batches). ``rank_loader(..., epoch=e, skip=done)``
  continues the epoch, on the same or another number of ranks (the position is counted
  in global batches), with the same global batch B and seed.
- iterable: the stream has no position of ours. A dataset with ``state_dict`` /
  ``load_state_dict`` (torchdata's ``Stateful`` protocol) that splits itself by rank
  (:class:`SplitsByRank`) and is read with ``num_workers=0`` advances in the caller's
  process, batch by batch (no prefetching there): the caller saves every rank's
  ``dataset.state_dict()`` after each step it keeps, and on resume calls
  ``load_state_dict`` on each rank before ``rank_loader`` (same number of ranks). With
  ``num_workers > 0`` the dataset lives in worker processes and the caller's copy does
  not move: resuming mid-epoch then needs torchdata's ``StatefulDataLoader`` (not a
  dependency of disttrain); without it the epoch restarts, and the caller says so.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, Sampler, get_worker_info

from disttrain.comm.errors import UsageError
from disttrain.data.sampler import GlobalBatchSampler

__all__ = [
    "RankBatchSampler",
    "RankSplit",
    "SplitsByRank",
    "more_on_every_rank",
    "rank_loader",
    "splits_itself",
]

# keywords rank_loader decides itself: given again, they would undo the rank's share
_OURS = ("sampler", "batch_sampler", "batch_size")


def rank_loader(
    dataset: Any,
    global_batch: int,
    rank: int,
    shards: int,
    *,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool | None = None,
    skip: int = 0,
    drop_last: bool | None = None,
    **dataloader_kwargs: Any,
) -> DataLoader:
    """A ``DataLoader`` of rank ``rank`` of ``shards``'s part of each global batch.

    Map-style: ``len()`` is the steps left in ``epoch`` after ``skip`` global batches
    already trained. ``shuffle`` (None: True) permutes from (seed, epoch), False keeps
    the data set's order; ``drop_last`` (None: True) skips the last n mod B samples of the
    epoch as GlobalBatchSampler does, False splits that partial global batch among the
    ranks (a rank whose slice is empty has one step fewer). Iterable: batches of B/N of
    this rank's share of the stream; ``drop_last`` (None: False) keeps each worker's last
    partial batch, so every sample is read once; ``shuffle`` and ``skip`` are the
    dataset's business and refused; a stream with ``set_epoch`` is told ``epoch``.
    Other keywords go to ``DataLoader`` unchanged.
    """
    _check_job(global_batch, rank, shards, dataloader_kwargs)
    if isinstance(dataset, IterableDataset):
        _check_stream(shuffle, skip)
        share = dataset if splits_itself(dataset) else RankSplit(dataset, rank, shards)
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)  # Hugging Face and torchdata streams reshuffle per epoch
        # drop_last off by default: a worker's last partial batch holds samples no one else has
        return DataLoader(
            share, batch_size=global_batch // shards, drop_last=bool(drop_last), **dataloader_kwargs
        )
    if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise UsageError(
            f"rank_loader: a {type(dataset).__name__} is neither a map-style data set "
            "(__len__ and __getitem__) nor a torch.utils.data.IterableDataset"
        )
    if dataloader_kwargs.get("in_order") is False:
        # out-of-order batches would put global batch t+1 at step t on some ranks only
        raise UsageError("rank_loader: in_order=False breaks the global batch of each step")
    sampler = RankBatchSampler(
        len(dataset),
        global_batch,
        rank,
        shards,
        epoch=epoch,
        seed=seed,
        shuffle=shuffle is not False,
        skip=skip,
        drop_last=drop_last is not False,
    )
    return DataLoader(dataset, batch_sampler=sampler, **dataloader_kwargs)


def _check_job(global_batch: int, rank: int, shards: int, kwargs: dict[str, Any]) -> None:
    """One line for each argument that cannot describe a rank's share of a global batch."""
    given = [k for k in _OURS if k in kwargs]
    if given:
        raise UsageError(
            f"rank_loader: {given[0]} is set from global_batch, rank and shards; leave it out"
        )
    if shards < 1 or not 0 <= rank < shards:
        raise UsageError(f"rank_loader: rank {rank} is not one of {shards} ranks (0..{shards - 1})")
    if global_batch < 1 or global_batch % shards:
        raise UsageError(
            f"rank_loader: global batch {global_batch} does not divide among {shards} ranks; "
            f"give a positive multiple of {shards}"
        )


class _InOrder(GlobalBatchSampler):
    """The global-batch rule over the data set's own order (``shuffle=False``)."""

    def permutation(self, epoch: int) -> torch.Tensor:
        return torch.arange(self.num_samples)


class RankBatchSampler(Sampler[list[int]]):
    """This rank's index list for each step of an epoch, from global batch ``skip`` on.

    The rule is GlobalBatchSampler's (the one place it is written); this class adds the
    resume point, the identity order and, with ``drop_last=False``, the last partial
    global batch split by ``torch.tensor_split`` (contiguous, in order, so the ranks'
    slices still join into the one-process batch). ``set_epoch`` reuses a loader, and
    its persistent workers, for another epoch.
    """

    def __init__(
        self,
        num_samples: int,
        global_batch: int,
        rank: int,
        shards: int,
        *,
        epoch: int = 0,
        seed: int = 0,
        shuffle: bool = True,
        skip: int = 0,
        drop_last: bool = True,
    ) -> None:
        super().__init__()
        rule = GlobalBatchSampler if shuffle else _InOrder
        self.rule = rule(num_samples, global_batch, rank, shards, seed)
        self.drop_last = drop_last
        rest = num_samples % global_batch
        # the partial global batch counts as a step of the epoch only when it is kept
        self.global_steps = self.rule.steps_per_epoch + (1 if rest and not drop_last else 0)
        # this rank's slice of it: tensor_split gives the first rest % N ranks one more
        self.tail = 0 if drop_last else rest // shards + (1 if rank < rest % shards else 0)
        if self.global_steps == 0:
            raise UsageError(
                f"rank_loader: {num_samples} samples hold no whole global batch of "
                f"{global_batch} (drop_last=False keeps a partial one)"
            )
        self.set_epoch(epoch, skip)

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        """Go over ``epoch`` next, after its first ``skip`` global batches (a resume)."""
        if not 0 <= skip <= self.global_steps:
            raise UsageError(
                f"rank_loader: skip={skip} global batches, but the epoch has {self.global_steps}"
            )
        self.epoch, self.skip = epoch, skip

    def __len__(self) -> int:
        full = self.rule.steps_per_epoch + (1 if self.tail else 0)  # an empty tail: no step
        return max(full - self.skip, 0)

    def __iter__(self) -> Iterator[list[int]]:
        steps = self.rule.epoch(self.epoch)[self.skip :]
        if self.tail and self.skip <= self.rule.steps_per_epoch:
            perm = self.rule.permutation(self.epoch)
            rest = perm[self.rule.steps_per_epoch * self.rule.global_batch :]
            steps.append(torch.tensor_split(rest, self.rule.world_size)[self.rule.rank])
        # plain lists: what a batch_sampler hands to the fetcher (and to worker processes)
        return (s.tolist() for s in steps)


@runtime_checkable
class SplitsByRank(Protocol):
    """An iterable data set that already yields only this rank's and this worker's share
    (it read the rank from torch.distributed, or was built for it, e.g. by Hugging Face's
    ``split_dataset_by_node``, and it splits among ``get_worker_info()``'s workers).
    Setting ``splits_by_rank = True`` on it says so; rank_loader then leaves it alone."""

    splits_by_rank: bool


def splits_itself(dataset: object) -> bool:
    """Whether ``dataset`` declares that it splits itself by rank (:class:`SplitsByRank`)."""
    return isinstance(dataset, SplitsByRank) and bool(dataset.splits_by_rank)


class RankSplit(IterableDataset):
    """The samples of ``dataset``'s stream that belong to this rank and loader worker:
    running index i with ``i % (shards * W) == rank * W + worker``.

    Every (rank, worker) pair reads the whole stream and keeps its share: nothing is
    assumed of the data set but ``__iter__``, and the shares are disjoint and complete
    for any stream, however uneven its pieces."""

    def __init__(self, dataset: IterableDataset, rank: int, shards: int) -> None:
        self.dataset, self.rank, self.shards = dataset, rank, shards

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()  # None in the caller's process (num_workers=0): one worker
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        ways = self.shards * workers
        return itertools.islice(iter(self.dataset), self.rank * workers + worker, None, ways)


def _check_stream(shuffle: bool | None, skip: int) -> None:
    """The map-style arguments an IterableDataset decides itself."""
    if shuffle:
        raise UsageError("rank_loader: an IterableDataset orders its own stream; drop shuffle")
    if skip:
        raise UsageError(
            "rank_loader: skip is for map-style data; an IterableDataset resumes from its "
            "own load_state_dict"
        )


def more_on_every_rank(have: bool, group: dist.ProcessGroup | None = None) -> bool:
    """Whether every rank of ``group`` has another batch: an allreduce (MIN) of ``have``.

    Every rank calls it once per step, before the step's collectives, so a rank that ran
    out stops all of them at the same step instead of leaving its peers waiting::

        batches = iter(loader)
        while more_on_every_rank((batch := next(batches, None)) is not None, group):
            step(batch)

    The batches other ranks still held at that point are not trained in this epoch."""
    on_gpu = dist.get_backend(group) == "nccl"  # NCCL reduces CUDA tensors only
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else None
    flag = torch.tensor([1 if have else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())
