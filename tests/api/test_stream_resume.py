"""A stream resumed mid-epoch (``run.loader`` of an ``IterableDataset``, issue #49).

A stream with ``state_dict`` / ``load_state_dict`` (torchdata's ``Stateful``) over 20
uneven shards, 2 ranks of 2 loader workers each: ``run.state_dict()`` mid-epoch (through
``torch.save`` and ``torch.load(weights_only=True)``: plain values only), loaded by a
fresh run, and the epoch goes on:

- on the same layout, with the very batches the uninterrupted epoch has from there;
- on another layout (1 loader worker a rank), with the samples left re-cut: each sample
  of the epoch is trained exactly once across the two runs;
- a stream without a state restarts its epoch, and one line says so.

``tests/api/test_kill_and_resume.py`` kills a worker of such a stream's run and resumes
it on another worker count.
"""

from __future__ import annotations

import collections
import contextlib
import io
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests import streams
from tests.harness import SharedWorlds

BATCH, CUT = 8, 7  # 20 steps an epoch on 2 ranks: the cut is mid-epoch
#: shard lengths, uneven (4 to 12), 160 samples in all: 40 for each (rank, worker) pair
LENGTHS = [4 + k * 5 % 9 for k in range(19)]
LENGTHS.append(160 - sum(LENGTHS))
SAMPLES = sum(LENGTHS)


class Shards(streams.Shards):
    """The shards of LENGTHS; each sample's input carries its id first (then a feature)."""

    lengths = LENGTHS

    def item(self, ident: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor([float(ident), ident % 7 / 7]), torch.tensor([ident % 3 / 3])


class StatefulShards(Shards, streams.StatefulShards):
    """The same stream with torchdata's ``Stateful`` protocol."""


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(x[:, 1:])  # the id is not a feature


def _run() -> Any:
    import multiprocessing

    import disttrain as dt

    # the harness's ranks are daemonic; only a non-daemonic one may start loader workers
    multiprocessing.current_process().daemon = False
    torch.manual_seed(0)
    model = Model()
    return dt.distribute(model, torch.optim.SGD(model.parameters(), lr=0.1), batch_size=BATCH)


def _steps(run: Any, data: Any, workers: int, stop: int | None = None) -> list[list[int]]:
    """The ids each step of ``run`` trains, from where it stands in epoch 0 (fork: the
    harness's forkserver would start each loader worker as a fresh interpreter)."""
    ids = []
    for x, y in run.loader(data, num_workers=workers, multiprocessing_context="fork"):
        run.step((x, y), F.mse_loss)
        ids.append([int(i) for i in x[:, 0]])
        if run.steps == stop:
            break
    return ids


def _saved(run: Any) -> dict[str, Any]:
    """``run.state_dict()`` through a file's bytes, loaded as a checkpoint is."""
    buffer = io.BytesIO()
    torch.save(run.state_dict(), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _resumed() -> dict[str, Any]:
    whole = _steps(_run(), StatefulShards(), 2)
    cut = _run()
    before = _steps(cut, StatefulShards(), 2, stop=CUT)
    state = _saved(cut)
    same = _run()
    same.load_state_dict(state)
    after = _steps(same, StatefulShards(), 2)
    other = _run()
    other.load_state_dict(state)
    recut = _steps(other, StatefulShards(), 1)
    return {
        "whole": whole,
        "before": before,
        "same": after,
        "recut": recut,
        "ranks": len(state["stream"]["ranks"]),
    }


def _plain() -> dict[str, Any]:
    cut = _run()
    before = _steps(cut, Shards(), 2, stop=3)
    state = _saved(cut)
    again = _run()
    again.load_state_dict(state)
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        after = _steps(again, Shards(), 2, stop=4)
    return {"before": before, "after": after, "said": said.getvalue(), "keys": sorted(state)}


WORLDS = SharedWorlds({"resumed": (2, _resumed, ()), "plain": (2, _plain, ())}, timeout=120)


def _ids(per_rank: list[dict[str, Any]], *keys: str) -> collections.Counter[int]:
    return collections.Counter(
        i for got in per_rank for key in keys for step in got[key] for i in step
    )


@pytest.mark.timeout(150)
def test_same_layout_goes_on_with_the_uninterrupted_epochs_batches() -> None:
    per_rank = WORLDS.get("resumed")
    for got in per_rank:
        assert len(got["before"]) == CUT
        assert got["before"] + got["same"] == got["whole"], "not the uninterrupted epoch's batches"
        assert got["ranks"] == 2, "the state must hold every rank's loader state"
    counts = _ids(per_rank, "before", "same")
    assert set(counts) == set(range(SAMPLES)) and set(counts.values()) == {1}


@pytest.mark.timeout(150)
def test_another_layout_trains_each_sample_of_the_epoch_once() -> None:
    per_rank = WORLDS.get("resumed")
    counts = _ids(per_rank, "before", "recut")
    assert set(counts) == set(range(SAMPLES)), "a sample never trained"
    assert set(counts.values()) == {1}, "a sample trained twice in the epoch"
    assert len(per_rank[0]["recut"]) == len(per_rank[1]["recut"])  # the rest shared evenly


@pytest.mark.timeout(150)
def test_a_stream_without_a_state_restarts_its_epoch_in_one_line() -> None:
    got = WORLDS.get("plain")[0]
    assert "stream" not in got["keys"]
    assert got["after"][0] == got["before"][0], "the epoch did not start again"
    lines = [ln for ln in got["said"].splitlines() if "starts again" in ln]
    assert len(lines) == 1 and "no position to resume from" in lines[0], got["said"]
