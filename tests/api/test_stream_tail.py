"""A stream's uneven end (issue 49, "Streaming"): every sample of the epoch trained once.

Streams over 20 uneven shards, 2 loader workers a rank, on 2 and 4 ranks, counted from
what ``run.step`` saw (the loss function records each target's sample id):

- a stream that splits itself by shard file (rank r of N reads the shards s with
  ``s % N == r``, its loader worker w of W every W-th of those): the ranks' shares differ
  by tens of samples, and the first rank to run out used to end the epoch for all;
- torch's round-robin split of a plain stream (``RankSplit``), whose pairs' shares differ
  by one sample: the total is chosen for each world so that the ranks' batch counts
  differ by more than one sample a data shard (the old agreement left those untrained);

under allreduce and local SGD on 2 and 4 ranks, and the parameter server (3 workers and
a server) on 4. Every data shard takes the same number of steps.

A state taken in the dealt tail (``run.state_dict()`` between two of its steps, through
a file) resumes exactly: on the same 2 ranks, and on 4, each sample of the epoch is
trained once across the two runs.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import IterableDataset, get_worker_info

from tests.harness import SharedWorlds

pytestmark = pytest.mark.xdist_group("api-stream-tail")

BATCH = 8
#: 20 shards of uneven lengths (2 to 12 samples), 140 samples in all: split by shard, the
#: ranks' shares differ by 24 samples on 2 ranks and 36 on 4 (3 and 5 steps of tail)
LENGTHS = [2 + 10 * k % 12 for k in range(20)]
FIRST = [sum(LENGTHS[:s]) for s in range(20)]
#: the round-robin stream's last shard for each world: 130 and 134 samples, where the old
#: agreement left 2 and 6 untrained (at least one a rank: the tail deals them all)
LAST = {2: 2, 4: 6}
#: the 2-rank world's tail state, for the 4-rank world (the test process's folder)
STATES = os.path.join(tempfile.gettempdir(), f"disttrain-stream-tail-{os.getpid()}")


@pytest.fixture(autouse=True, scope="session")
def _states_removed() -> Iterator[None]:
    yield
    shutil.rmtree(STATES, ignore_errors=True)


def _sample(ident: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two features, and a target that carries the sample's id first."""
    x = torch.tensor([ident % 5 / 5, ident % 3 / 3])
    return x, torch.tensor([float(ident), float(x.sum())])


class OwnShards(IterableDataset):
    """Splits itself: data shard ``rank`` of ``ranks`` reads its shard files, each of its
    loader workers every ``W``-th of them; the place (a stateful stream) is the samples
    this worker has yielded."""

    splits_by_rank = True

    def __init__(self, rank: int, ranks: int) -> None:
        self.rank, self.ranks, self.done = rank, ranks, 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = [s for s in range(20) if s % self.ranks == self.rank]
        idents = [FIRST[s] + o for s in mine[worker::workers] for o in range(LENGTHS[s])]
        for ident in idents[self.done :]:
            self.done += 1
            yield _sample(ident)
        self.done = 0


class StatefulOwnShards(OwnShards):
    def state_dict(self) -> dict[str, int]:
        return {"done": self.done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.done = int(state["done"])


class Plain(IterableDataset):
    """The 20 shards as one stream (``world`` picks the last shard's length)."""

    def __init__(self, world: int) -> None:
        self.total = sum(LENGTHS[:-1]) + LAST[world]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return (_sample(i) for i in range(self.total))


def _run(strategy: str, settings: dict[str, Any]) -> Any:
    import multiprocessing

    import disttrain as dt

    # the harness's ranks are daemonic; only a non-daemonic one may start loader workers
    multiprocessing.current_process().daemon = False
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1))  # 2 stages' worth
    settings = {"batch_size": BATCH, **settings}
    return dt.distribute(model, torch.optim.SGD(model.parameters(), lr=0.05), strategy, **settings)


def _stream(run: Any, kind: str) -> Any:
    from disttrain.strategies.capabilities import data_shard

    if kind == "plain":
        import torch.distributed as dist

        return Plain(dist.get_world_size())
    return (StatefulOwnShards if kind == "stateful" else OwnShards)(*data_shard(run.strategy))


def _epoch(run: Any, data: Any, stop: int | None = None) -> dict[str, Any]:
    """The ids ``run.step`` trained (the loss reads them), its steps, what it said, and
    (a stateful stream) the steps taken before the dealt tail began (fork: loader workers
    start in milliseconds, the harness's forkserver would start interpreters)."""
    seen: list[int] = []

    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        seen.extend(int(i) for i in target[:, 0])
        return F.mse_loss(out, target[:, 1:])

    steps, before_tail, said = 0, None, io.StringIO()
    with contextlib.redirect_stderr(said):
        for batch in run.loader(data, num_workers=2, multiprocessing_context="fork"):
            run.step(batch, loss)
            steps += 1
            stream = run._stream
            in_tail = stream is not None and getattr(stream.end, "left", None) is not None
            if in_tail and before_tail is None:
                before_tail = steps - 1
            if steps == stop:
                break
    return {"seen": seen, "steps": steps, "said": said.getvalue(), "tail_at": before_tail}


def _counted(strategy: str, settings: dict[str, Any], kind: str) -> dict[str, Any] | None:
    run = _run(strategy, settings)
    if run.serves:
        run.serve()
        return None
    got = _epoch(run, _stream(run, kind))
    run.finish()
    return got


def _in_the_tail(states: str) -> dict[str, Any]:
    """The whole epoch; then cut after the tail's first step, saved, and resumed on the
    same ranks; the state left for the 4-rank world."""
    import torch.distributed as dist

    run = _run("allreduce", {})
    whole = _epoch(run, _stream(run, "stateful"))
    cut_at = whole["tail_at"] + 1
    run = _run("allreduce", {})
    before = _epoch(run, _stream(run, "stateful"), stop=cut_at)
    state = run.state_dict()
    if dist.get_rank() == 0:
        os.makedirs(states, exist_ok=True)
        torch.save(state, os.path.join(states, "tail.pt"))
    dist.barrier()
    again = _run("allreduce", {})
    again.load_state_dict(torch.load(os.path.join(states, "tail.pt"), weights_only=True))
    after = _epoch(again, _stream(again, "stateful"))
    left = [len(r.get("tail") or []) for r in state["stream"]["ranks"]]
    return {"whole": whole, "before": before, "after": after, "left": left}


def _resumed_on_four(states: str) -> dict[str, Any]:
    run = _run("allreduce", {})
    run.load_state_dict(torch.load(os.path.join(states, "tail.pt"), weights_only=True))
    return _epoch(run, _stream(run, "stateful"))


JOBS: dict[str, tuple[int, Any, tuple[Any, ...]]] = {}
for world in (2, 4):
    for strategy in ("allreduce", "localsgd"):
        JOBS[f"own-{strategy}-{world}"] = (world, _counted, (strategy, {}, "own"))
    JOBS[f"plain-allreduce-{world}"] = (world, _counted, ("allreduce", {}, "plain"))
#: 3 workers (and a server): a global batch they divide
JOBS["own-ps-4"] = (4, _counted, ("ps", {"ps_mode": "sync", "batch_size": 6}, "own"))
#: 2 data shards of 2 pipeline stages: a shard's two ranks read alike, the last one's
#: loss counts its samples
JOBS["own-hybrid-4"] = (4, _counted, ("hybrid", {"dp": 2, "pp": 2, "microbatches": 1}, "own"))
JOBS["tail-2"] = (2, _in_the_tail, (STATES,))
JOBS["tail-4"] = (4, _resumed_on_four, (STATES,))
WORLDS = SharedWorlds(JOBS, timeout=240)


def _samples(kind: str, world: int) -> set[int]:
    total = sum(LENGTHS) if kind == "own" else sum(LENGTHS[:-1]) + LAST[world]
    return set(range(total))


COUNTED = [name for name in JOBS if not name.startswith("tail")]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", COUNTED)
def test_every_sample_is_trained_once_and_every_shard_steps_alike(case: str) -> None:
    kind, world = case.split("-")[0], int(case.split("-")[-1])
    if world == 4:
        WORLDS.get("tail-2")  # the 2-rank world first: it leaves the 4-rank world's state
    per_rank = [got for got in WORLDS.get(case) if got is not None]
    counts = collections.Counter(i for got in per_rank for i in got["seen"])
    assert set(counts) == _samples(kind, world), "a sample was not trained"
    assert set(counts.values()) == {1}, "a sample was trained twice"
    assert len({got["steps"] for got in per_rank}) == 1, "the data shards stepped unequally"
    assert not any("not trained" in got["said"] for got in per_rank), per_rank[0]["said"]


@pytest.mark.timeout(300)
def test_a_state_taken_in_the_tail_resumes_on_the_same_ranks() -> None:
    per_rank = WORLDS.get("tail-2")
    assert per_rank[0]["left"] and min(per_rank[0]["left"]) >= 1, "not cut inside the tail"
    counts = collections.Counter(
        i for got in per_rank for key in ("before", "after") for i in got[key]["seen"]
    )
    assert set(counts) == _samples("own", 2) and set(counts.values()) == {1}
    for got in per_rank:  # the very batches the uninterrupted epoch trained
        assert got["before"]["seen"] + got["after"]["seen"] == got["whole"]["seen"]


@pytest.mark.timeout(300)
def test_a_state_taken_in_the_tail_resumes_on_four_ranks() -> None:
    before = WORLDS.get("tail-2")
    after = WORLDS.get("tail-4")
    counts = collections.Counter(i for got in before for i in got["before"]["seen"])
    counts.update(i for got in after for i in got["seen"])
    assert set(counts) == _samples("own", 2), "a sample was not trained"
    assert set(counts.values()) == {1}, "a sample was trained twice"
    assert len({got["steps"] for got in after}) == 1, "the data shards stepped unequally"
