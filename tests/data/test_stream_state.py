"""A stream's place mid-epoch (``rank_loader(..., resume=)``), the ranks simulated in
one process: each rank's ``stream_state`` after some steps, a new layout's loaders
continued from them, every sample of the epoch yielded exactly once.

- re-cut twice over (2 ranks of 2 loader workers, then 3 ranks in-process, then 1 rank
  of 2 workers): the second re-cut is of a re-cut's state;
- the state is plain values (it loads with ``torch.load(weights_only=True)``); numpy's
  scalars in a dataset's state become numbers, anything else is refused in one line;
- a stream that splits itself resumes on its own layout only, and says which.
"""

from __future__ import annotations

import collections
import io
from typing import Any

import numpy as np
import pytest
import torch

from disttrain.comm.errors import UsageError
from disttrain.data.torchloader import rank_loader, resume_refused, stream_state
from tests.streams import StatefulShards

LENGTHS = [4 + k * 5 % 9 for k in range(20)]  # uneven shards, 157 samples
SAMPLES = sum(LENGTHS)


class Shards(StatefulShards):
    """Stateful shards of LENGTHS; a sample is its id."""

    lengths = LENGTHS


def _epoch(
    shards: int, workers: int, steps: int | None, resume: Any = None, data: type = Shards
) -> tuple[list[int], list[dict[str, Any]]]:
    """Every rank's ids over ``steps`` steps (None: to the first rank's end), and every
    rank's state then, through a checkpoint's bytes."""
    batch = 2 * shards
    kw: dict[str, Any] = {"multiprocessing_context": "fork"} if workers else {}
    loaders = [
        rank_loader(data(), batch, r, shards, resume=resume, num_workers=workers, **kw)
        for r in range(shards)
    ]
    its, ids, done = [iter(loader) for loader in loaders], [], 0
    while steps is None or done < steps:
        got = [next(it, None) for it in its]
        ids += [int(i) for b in got if b is not None for i in b]
        if any(b is None for b in got):
            assert all(b is None for b in got), "the ranks ran out at different steps"
            break
        done += 1
    buffer = io.BytesIO()
    torch.save([stream_state(loader, workers) for loader in loaders], buffer)
    buffer.seek(0)
    return ids, torch.load(buffer, weights_only=True)


@pytest.mark.timeout(60)
def test_a_recut_of_a_recut_yields_each_sample_once() -> None:
    first, saved = _epoch(2, 2, steps=5)  # prefetching loader workers, 20 samples yielded
    middle, again = _epoch(3, 0, steps=4, resume=saved)
    rest, _ = _epoch(1, 2, steps=None, resume=again)
    counts = collections.Counter(first + middle + rest)
    assert len(first) == 20 and len(middle) == 24
    assert set(counts) == set(range(SAMPLES)), "a sample never yielded"
    assert set(counts.values()) == {1}, "a sample yielded twice"


class Numpy(Shards):
    def state_dict(self) -> dict[str, Any]:
        return {"shard": np.int64(self.shard), "offset": self.offset}


class Unsent(Shards):
    def state_dict(self) -> dict[str, Any]:
        return {"shard": self.shard, "seen": {self.offset}}


def test_a_state_is_plain_values_or_refused() -> None:
    _, saved = _epoch(1, 0, steps=2, data=Numpy)
    assert type(saved[0]["loader"]["dataset_state"]["dataset"]["shard"]) is int
    with pytest.raises(UsageError, match=r"holds a set at loader\[.*'seen'\]: .*without pickle"):
        _epoch(1, 0, steps=2, data=Unsent)


class OwnSplit(Shards):
    splits_by_rank = True


def test_a_stream_that_splits_itself_resumes_on_its_own_layout_only() -> None:
    _, saved = _epoch(2, 0, steps=1, data=OwnSplit)
    assert resume_refused(OwnSplit(), saved, 2, 0) is None
    why = resume_refused(OwnSplit(), saved, 1, 0)
    assert why is not None and "the layout it was saved on: 2 rank(s) of 0 loader" in why
    with pytest.raises(UsageError, match="splits itself by rank"):
        rank_loader(OwnSplit(), 4, 0, 1, resume=saved)


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"in_order": False}, "in_order=False leaves a stream's state unsaved"),
        ({"snapshot_every_n_steps": 5}, "snapshot_every_n_steps is 1 for a stream"),
    ],
)
def test_what_would_lose_a_streams_place_is_refused(given: dict[str, Any], said: str) -> None:
    with pytest.raises(UsageError, match=said):
        rank_loader(Shards(), 4, 0, 2, **given)
