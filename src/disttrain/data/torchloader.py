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
numbers of batches at the end: a rank that ran out simply yields nothing more; the
caller makes the ranks agree and deals what the others still hold evenly among them
(:mod:`disttrain.data.tail`), or, with the bare :func:`more_on_every_rank`, stops
them all at the first rank's end.

Positions, for a resume:

- map-style: ``(epoch, global batches trained in that epoch)``. The caller counts the
  steps it has *trained*, not the batches the loader produced (the loader runs ahead
  by ``prefetch_factor * num_workers`` batches). ``rank_loader(..., epoch=e, skip=done)``
  continues the epoch, on the same or another number of ranks (the position is counted
  in global batches), with the same global batch B and seed.
- iterable with ``state_dict`` / ``load_state_dict`` (torchdata's ``Stateful``
  protocol): the loader is torchdata's ``StatefulDataLoader``, whose ``state_dict()``
  holds every loader worker's copy of the dataset's state as of the batches it has
  *yielded* (its snapshots travel with each batch and are applied when that batch leaves
  the loader, so prefetched batches do not count). The rank's share is a
  :class:`StatefulRankSplit`: its state is the inner dataset's state plus its own
  running index in the stream. Saved as :func:`stream_state` (every rank's, by rank),
  ``rank_loader(..., resume=saved)`` continues the epoch: on the same layout (ranks and
  ``num_workers``) torchdata's own ``load_state_dict`` puts each worker back; on another
  layout the remaining samples are re-cut (:func:`recut`): every (rank, worker) pair read
  the whole stream, so the state of the pair that had read least is a place in the
  stream every new pair can start from, and each old pair's running index says which of
  the samples after it were already yielded; the new pairs split the rest among
  themselves as they would a fresh stream. A dataset that splits itself
  (:class:`SplitsByRank`) resumes on its saved layout only (:func:`resume_refused`
  says why not otherwise; the caller restarts the epoch).
- iterable without them: the stream has no position of ours; the caller restarts the
  epoch and says so.
"""

from __future__ import annotations

import itertools
import warnings
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
    "StatefulRankSplit",
    "is_stateful",
    "more_on_every_rank",
    "rank_loader",
    "recut",
    "resume_refused",
    "splits_itself",
    "stream_state",
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
    resume: list[dict[str, Any]] | None = None,
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
    dataset's business and refused; a stream with ``set_epoch`` is told ``epoch``. A
    stream with ``state_dict`` / ``load_state_dict`` is read by torchdata's
    ``StatefulDataLoader``, and ``resume`` (:func:`stream_state` of every rank, by rank,
    saved mid-epoch) continues that epoch. Other keywords go to the loader unchanged.
    """
    _check_job(global_batch, rank, shards, dataloader_kwargs)
    if isinstance(dataset, IterableDataset):
        _check_stream(shuffle, skip)
        return _stream_loader(
            dataset, global_batch, rank, shards, epoch, drop_last, resume, dataloader_kwargs
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


def _stream_loader(
    dataset: IterableDataset,
    global_batch: int,
    rank: int,
    shards: int,
    epoch: int,
    drop_last: bool | None,
    resume: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> DataLoader:
    """:func:`rank_loader` of a stream: torchdata's loader for one with a state, else
    torch's over this rank's share (:class:`RankSplit`, unless it splits itself)."""
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(epoch)  # Hugging Face and torchdata streams reshuffle per epoch
    if is_stateful(dataset):
        return _stateful_loader(
            dataset, global_batch, rank, shards, bool(drop_last), resume, kwargs
        )
    if resume is not None:
        raise UsageError(
            f"rank_loader: resume= needs a stream with state_dict and load_state_dict; "
            f"a {type(dataset).__name__} has none"
        )
    share = dataset if splits_itself(dataset) else RankSplit(dataset, rank, shards)
    # drop_last off by default: a worker's last partial batch holds samples no one else has
    return DataLoader(share, batch_size=global_batch // shards, drop_last=bool(drop_last), **kwargs)


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
    for any stream, however uneven its pieces.

    After a resume on another layout (:func:`recut`) the stream is read from where the
    pair that had read least stood, through the earlier layouts' *levels*: a sample
    that one of them had already yielded is passed over, and the running index of the
    split is counted over the samples left (``counts[-1]``), so the new pairs share
    the rest as evenly as a fresh stream."""

    def __init__(self, dataset: IterableDataset, rank: int, shards: int) -> None:
        self.dataset, self.rank, self.shards = dataset, rank, shards
        #: earlier layouts: (their ways, each old pair's next running index at that level)
        self.levels: list[tuple[int, list[int]]] = []
        #: where an iteration begins: the running index at each level, and the split's
        self.start: list[int] = [0]
        self.counts: list[int] = [0]
        #: the inner dataset's state to load as the iteration begins (a resume's)
        self.inner: Any = None
        self.where = (0, 1)  # (worker, workers), as the last iteration found them

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()  # None in the caller's process (num_workers=0): one worker
        self.where = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.inner is not None:  # now, in the process that reads (a loader worker)
            self.dataset.load_state_dict(self.inner)  # type: ignore[attr-defined]
            self.inner = None
        self.counts = list(self.start)
        worker, workers = self.where
        ways = self.shards * workers
        if not self.levels:
            start, mine = self.counts[0], self.rank * workers + worker
            first = (mine - start) % ways  # the first sample of this pair's at or after start
            return self._counted(
                itertools.islice(iter(self.dataset), first, None, ways), start + first, ways
            )
        return self._through_levels(ways, self.rank * workers + worker)

    def _counted(self, samples: Iterator[Any], at: int, ways: int) -> Iterator[Any]:
        """``samples`` (every ``ways``-th from running index ``at``), the count kept."""
        for sample in samples:
            self.counts[0] = at + 1  # read up to this one: the next pair's are not yet read
            yield sample
            at += ways

    def _through_levels(self, ways: int, mine: int) -> Iterator[Any]:
        counts, levels = self.counts, self.levels
        for sample in iter(self.dataset):
            for level, (old_ways, yielded) in enumerate(levels):
                j = counts[level]
                counts[level] = j + 1
                if j < yielded[j % old_ways]:  # that layout's pair had yielded it
                    break
            else:
                j = counts[-1]
                counts[-1] = j + 1
                if j % ways == mine:
                    yield sample


class StatefulRankSplit(RankSplit):
    """A :class:`RankSplit` of a stream with ``state_dict`` / ``load_state_dict``, itself
    stateful (torchdata's ``Stateful``): its state is the inner dataset's state, this
    split's running counts and its earlier layouts' levels, all plain values."""

    def state_dict(self) -> dict[str, Any]:
        worker, workers = self.where
        inner = self.inner if self.inner is not None else self.dataset.state_dict()  # type: ignore[attr-defined]
        return {
            "rank_split": 1,
            "rank": self.rank,
            "shards": self.shards,
            "worker": worker,
            "workers": workers,
            "counts": list(self.counts),
            "levels": [[w, list(y)] for w, y in self.levels],
            "dataset": inner,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from ``state`` (this pair's own, as torchdata restores it, or a re-cut's
        start from :func:`recut`); the inner dataset is told as the iteration begins."""
        self.levels = [(int(w), [int(n) for n in y]) for w, y in state["levels"]]
        self.start = [int(n) for n in state["counts"]]
        self.counts = list(self.start)
        self.inner = state["dataset"]


def is_stateful(dataset: object) -> bool:
    """Whether ``dataset`` has torchdata's ``Stateful`` protocol (``state_dict`` and
    ``load_state_dict``)."""
    return callable(getattr(dataset, "state_dict", None)) and callable(
        getattr(dataset, "load_state_dict", None)
    )


def _stateful_loader(
    dataset: Any,
    global_batch: int,
    rank: int,
    shards: int,
    drop_last: bool,
    resume: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
) -> DataLoader:
    """torchdata's ``StatefulDataLoader`` over this rank's share, continued from
    ``resume`` (same layout: torchdata's own restore; another: :func:`recut`)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    if kwargs.get("in_order") is False:  # torchdata keeps no state of out-of-order batches
        raise UsageError("rank_loader: in_order=False leaves a stream's state unsaved")
    if kwargs.get("snapshot_every_n_steps", 1) != 1:
        # a state of every step: a re-cut needs each pair's running index as trained
        raise UsageError("rank_loader: snapshot_every_n_steps is 1 for a stream; leave it out")
    workers = int(kwargs.get("num_workers", 0))
    share = dataset if splits_itself(dataset) else StatefulRankSplit(dataset, rank, shards)
    if resume is not None:
        why = resume_refused(dataset, resume, shards, workers)
        if why:
            raise UsageError(f"rank_loader: {why}")
    with warnings.catch_warnings():  # torchdata 0.11 calls torch's deprecated set_vital
        warnings.filterwarnings("ignore", "'set_vital' is deprecated", UserWarning)
        loader = StatefulDataLoader(
            share, batch_size=global_batch // shards, drop_last=drop_last, **kwargs
        )
    if resume is None:
        return loader
    if _same_layout(resume, shards, workers):
        loader.load_state_dict(resume[rank]["loader"])
    else:
        share.load_state_dict(recut(resume))
    return loader


def stream_state(loader: Any, workers: int) -> dict[str, Any]:
    """This rank's part of a stream's position (``loader`` a ``StatefulDataLoader`` of
    ``workers`` loader workers), in plain values only: it travels without pickle
    (``dataparallel.states``) and loads with ``torch.load(weights_only=True)``. numpy's
    scalars become Python numbers; anything else that is not a tensor, number, string,
    bool, None, list, tuple or dict is refused, naming where it stands."""
    return {"workers": workers, "loader": _plain(loader.state_dict(), "loader")}


def _plain(value: Any, where: str) -> Any:
    if isinstance(value, torch.Tensor) or value is None:
        return value
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {_plain(k, where): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        item = value.item()  # a numpy scalar; an array's item() fails below
        if isinstance(item, (bool, int, float, str)):
            return item
    raise UsageError(
        f"a stream's state holds a {type(value).__name__} at {where}: a dataset's "
        "state_dict travels without pickle, so it may hold tensors, numbers, strings, "
        "lists and dicts only"
    )


def _same_layout(saved: list[dict[str, Any]], shards: int, workers: int) -> bool:
    return len(saved) == shards and all(int(r["workers"]) == workers for r in saved)


def _pair_states(saved: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every old (rank, worker) pair's :class:`StatefulRankSplit` state, by pair."""
    found: dict[tuple[int, int], dict[str, Any]] = {}

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if value.get("rank_split") == 1:
                found[(int(value["rank"]), int(value["worker"]))] = value
                return
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk([r["loader"] for r in saved])
    return [found[k] for k in sorted(found)]


def resume_refused(
    dataset: Any, saved: list[dict[str, Any]], shards: int, workers: int
) -> str | None:
    """Why ``saved`` (every rank's :func:`stream_state`) cannot continue on ``shards``
    ranks of ``workers`` loader workers, or None when it can."""
    if _same_layout(saved, shards, workers):
        return None
    was = f"{len(saved)} rank(s) of {int(saved[0]['workers'])} loader worker(s)"
    if splits_itself(dataset):
        return (
            f"the {type(dataset).__name__} splits itself by rank, so its state resumes only "
            f"on the layout it was saved on: {was}"
        )
    pairs = _pair_states(saved)
    ways = len(saved) * max(int(saved[0]["workers"]), 1)
    if len(pairs) != ways or any(int(p["shards"]) * int(p["workers"]) != ways for p in pairs):
        return f"the saved state ({was}) does not hold every loader worker's place in the stream"
    return None


def recut(saved: list[dict[str, Any]]) -> dict[str, Any]:
    """A :class:`StatefulRankSplit` start, for any layout, from ``saved`` (every rank's
    :func:`stream_state` of another layout).

    Every old pair read the whole stream, so the inner dataset's state of the pair that
    had read least is a place every pair passed; from there, a sample is passed over
    when its old pair had yielded it (its running index below that pair's), and the
    rest are split anew. Each earlier re-cut stays a level of its own."""
    pairs = _pair_states(saved)
    ways = len(pairs)
    least = min(pairs, key=lambda p: [int(n) for n in p["counts"]])
    # the pairs in the order of their index k = rank * W + worker (as sorted)
    yielded = [int(p["counts"][-1]) for p in pairs]
    return {
        "levels": [*least["levels"], [ways, yielded]],
        # below the least pair's place every old sample was yielded: the new count is 0
        "counts": [*least["counts"], 0],
        "dataset": least["dataset"],
    }


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

    The batches other ranks still held at that point are not trained in this epoch;
    :class:`~disttrain.data.tail.EvenEnd` deals them out instead (``run.loader``)."""
    on_gpu = dist.get_backend(group) == "nccl"  # NCCL reduces CUDA tensors only
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else None
    flag = torch.tensor([1 if have else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())
