"""torch's DataLoader for one rank: the global-batch rule, resume, worker processes, streams."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import IterableDataset

from disttrain.comm.errors import UsageError
from disttrain.data.torchloader import RankBatchSampler, rank_loader, splits_itself
from tests.harness import run_world

N_SAMPLES, BATCH = 50, 8  # 50 mod 8 = 2: a partial global batch at the end of each epoch


class Numbers(torch.utils.data.Dataset):
    """Map-style: sample i is the tensor [i] (so a batch names the indices it holds)."""

    def __init__(self, n: int = N_SAMPLES) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i])


def ids(batches: Any) -> list[list[int]]:
    return [b.flatten().tolist() for b in batches]


def joined(per_rank: list[list[list[int]]], step: int) -> list[int]:
    """The ranks' batches of ``step`` one after another (a rank with no such step adds none)."""
    return [i for steps in per_rank if step < len(steps) for i in steps[step]]


def one_process(epoch: int, shuffle: bool = True, drop_last: bool = True) -> list[list[int]]:
    loader = rank_loader(
        Numbers(), BATCH, 0, 1, epoch=epoch, seed=7, shuffle=shuffle, drop_last=drop_last
    )
    return ids(loader)


@pytest.mark.parametrize("shards", [1, 2, 4])
@pytest.mark.parametrize("shuffle", [True, False])
def test_ranks_together_hold_the_one_process_batch_at_every_step(
    shards: int, shuffle: bool
) -> None:
    expected = one_process(3, shuffle)
    per_rank = [
        ids(rank_loader(Numbers(), BATCH, r, shards, epoch=3, seed=7, shuffle=shuffle))
        for r in range(shards)
    ]
    assert all(len(steps) == N_SAMPLES // BATCH for steps in per_rank)
    for step, batch in enumerate(expected):
        assert joined(per_rank, step) == batch  # same order within it
    if not shuffle:
        assert expected[0] == list(range(BATCH))
    else:
        assert expected != one_process(4), "another epoch, another permutation"


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_a_kept_partial_batch_is_split_in_order_and_an_empty_slice_is_no_step(shards: int) -> None:
    expected = one_process(0, drop_last=False)
    assert len(expected[-1]) == N_SAMPLES % BATCH
    loaders = [
        rank_loader(Numbers(), BATCH, r, shards, seed=7, drop_last=False) for r in range(shards)
    ]
    per_rank = [ids(loader) for loader in loaders]
    assert [len(loader) for loader in loaders] == [len(steps) for steps in per_rank]
    for step, batch in enumerate(expected):
        assert joined(per_rank, step) == batch


@pytest.mark.parametrize(("before", "after"), [(2, 2), (1, 4), (4, 2)])
def test_a_resume_after_k_global_batches_continues_the_epoch_on_any_rank_count(
    before: int, after: int
) -> None:
    k = 2
    expected = one_process(1)
    first = [ids(rank_loader(Numbers(), BATCH, r, before, epoch=1, seed=7)) for r in range(before)]
    resumed = [
        rank_loader(Numbers(), BATCH, r, after, epoch=1, seed=7, skip=k) for r in range(after)
    ]
    rest = [ids(loader) for loader in resumed]
    assert all(len(loader) == len(expected) - k for loader in resumed)
    for step in range(len(expected) - k):
        assert joined(rest, step) == expected[k + step]
    # the first k steps of the first run and the resumed rest: the epoch's samples once each
    trained = [i for steps in first for batch in steps[:k] for i in batch]
    trained += [i for steps in rest for batch in steps for i in batch]
    assert sorted(trained) == sorted(i for batch in expected for i in batch)


def test_a_resume_at_the_end_of_the_epoch_is_an_empty_loader() -> None:
    loader = rank_loader(Numbers(), BATCH, 1, 2, skip=N_SAMPLES // BATCH)
    assert len(loader) == 0 and list(loader) == []


class Recorded(Numbers):
    """Remembers which samples were read, so a resume can show it skipped without reading."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[int] = []

    def __getitem__(self, i: int) -> torch.Tensor:
        self.read.append(i)
        return super().__getitem__(i)


def test_skipped_batches_are_never_read() -> None:
    data = Recorded()
    loader = rank_loader(data, BATCH, 0, 1, seed=7, skip=3)
    assert ids(loader) == one_process(0)[3:]
    assert sorted(data.read) == sorted(i for b in one_process(0)[3:] for i in b)


def test_worker_processes_give_the_same_batches_as_the_calling_process() -> None:
    inline = ids(rank_loader(Numbers(), BATCH, 1, 2, epoch=2, seed=7))
    workers = rank_loader(
        Numbers(),
        BATCH,
        1,
        2,
        epoch=2,
        seed=7,
        num_workers=2,
        prefetch_factor=2,
        persistent_workers=True,
    )
    assert ids(workers) == inline
    # set_epoch reuses the loader (and its persistent workers) for the next epoch
    sampler = workers.batch_sampler
    assert isinstance(sampler, RankBatchSampler)
    sampler.set_epoch(3, skip=1)
    assert ids(workers) == ids(rank_loader(Numbers(), BATCH, 1, 2, epoch=3, seed=7, skip=1))


class Records(torch.utils.data.Dataset):
    """Dict samples, as Hugging Face data sets give them."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": torch.full((3,), i), "label": i, "name": f"s{i}"}


def test_dict_samples_and_a_collate_fn_pass_through() -> None:
    batch = next(iter(rank_loader(Records(), 8, 1, 2, shuffle=False)))
    assert batch["input_ids"].shape == (4, 3) and batch["label"].tolist() == [4, 5, 6, 7]
    assert batch["name"] == ["s4", "s5", "s6", "s7"]

    def names(samples: list[dict[str, Any]]) -> list[str]:
        return [s["name"] for s in samples]

    loader = rank_loader(Records(), 8, 0, 2, shuffle=False, collate_fn=names, num_workers=1)
    assert list(loader) == [["s0", "s1", "s2", "s3"], ["s8", "s9", "s10", "s11"]]


class Shards(IterableDataset):
    """A stream over 20 "shard files" of uneven lengths: shard s holds s % 7 + 1 samples."""

    lengths = tuple(s % 7 + 1 for s in range(20))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for shard, length in enumerate(self.lengths):
            for j in range(length):
                yield {"shard": shard, "sample": j}


@pytest.mark.parametrize("shards", [2, 4])
def test_a_stream_is_read_once_across_ranks_and_loader_workers(shards: int) -> None:
    seen: Counter[tuple[int, int]] = Counter()
    steps = []
    for rank in range(shards):  # the ranks, one after another in this process
        loader = rank_loader(Shards(), 4 * shards, rank, shards, num_workers=2)
        batches = list(loader)
        steps.append(len(batches))
        assert all(len(b["shard"]) <= 4 for b in batches)  # B/N per rank
        for b in batches:
            seen.update(zip(b["shard"].tolist(), b["sample"].tolist(), strict=True))
    every = {(s, j) for s, n in enumerate(Shards.lengths) for j in range(n)}
    assert set(seen) == every and set(seen.values()) == {1}


class OwnSplit(Shards):
    """A stream that splits itself by rank (here: it yields only shard 3) and says so."""

    splits_by_rank = True
    lengths = (0, 0, 0, 5)


def test_a_stream_that_splits_itself_is_left_alone() -> None:
    assert splits_itself(OwnSplit()) and not splits_itself(Shards())
    batches = list(rank_loader(OwnSplit(), 4, 1, 2))
    assert [b["sample"].tolist() for b in batches] == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: rank_loader(Numbers(), 10, 0, 4), "global batch 10 does not divide among 4"),
        (lambda: rank_loader(Numbers(), 8, 2, 2), "rank 2 is not one of 2 ranks"),
        (lambda: rank_loader(Numbers(), 8, 0, 2, batch_size=4), "batch_size is set from"),
        (lambda: rank_loader(Numbers(), 8, 0, 2, sampler=[0]), "sampler is set from"),
        (lambda: rank_loader(Numbers(), 8, 0, 2, batch_sampler=[[0]]), "batch_sampler is set"),
        (lambda: rank_loader(Numbers(), 8, 0, 2, skip=7), "skip=7 global batches"),
        (lambda: rank_loader(Numbers(4), 8, 0, 2), "4 samples hold no whole global batch"),
        (lambda: rank_loader(Numbers(), 8, 0, 2, in_order=False), "in_order=False"),
        (lambda: rank_loader(iter(range(3)), 8, 0, 2), "neither a map-style data set"),
        (lambda: rank_loader(Shards(), 8, 0, 2, shuffle=True), "orders its own stream"),
        (lambda: rank_loader(Shards(), 8, 0, 2, skip=1), "skip is for map-style data"),
    ],
)
def test_bad_arguments_are_one_line(call: Any, words: str) -> None:
    with pytest.raises(UsageError) as err:
        call()
    assert words in str(err.value) and "\n" not in str(err.value)


class Stream(IterableDataset):
    """The numbers 0..n-1, streamed."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


def _uneven_epoch() -> tuple[int, int]:
    """9 samples over 2 ranks at B=4: rank 0 holds 3 batches, rank 1 two; both stop at 2."""
    import torch.distributed as dist

    from disttrain.data.torchloader import more_on_every_rank

    batches = iter(rank_loader(Stream(9), 4, dist.get_rank(), 2))
    steps, held = 0, 0
    while more_on_every_rank((batch := next(batches, None)) is not None):
        dist.all_reduce(batch.sum())  # the step's own collective: a hang if a rank had left
        steps += 1
    held = steps + (batch is not None) + sum(1 for _ in batches)
    return steps, held


def test_ranks_agree_the_epoch_ended_when_one_runs_out() -> None:
    assert run_world(_uneven_epoch, 2, timeout=60, collective_timeout=20) == [(2, 3), (2, 2)]
