"""The dealing of a stream's uneven end (``disttrain.data.tail``), in one process.

- :func:`deal`: every row of the tail in exactly one final batch, every data shard the
  same number of batches, each of 1 to ``b`` rows, the shards' pieces of one step within
  one row of each other, the fewest steps that hold them; at most D - 1 rows left out,
  only when fewer than D are left (or ``b = 1``);
- a batch's rows joined and cut again keep its structure (dicts, pairs) and dtypes;
- a leaf that is not a tensor is named; batches that cannot be joined row by row say why;
- a state's saved tail (:class:`~disttrain.api.loader.SavedTail`) dealt among another
  number of shards gives each sample to exactly one of them.
"""

from __future__ import annotations

import pytest
import torch

from disttrain.api.loader import SavedTail
from disttrain.data.tail import deal, join, not_a_tensor, pieces_of


@pytest.mark.parametrize("shards", [1, 2, 3, 4])
@pytest.mark.parametrize("per_batch", [1, 2, 4])
def test_every_row_once_and_every_shard_the_same_steps(shards: int, per_batch: int) -> None:
    for samples in range(0, 3 * shards * per_batch + 2):
        plan = deal(samples, shards, per_batch)
        rows = sorted(i for shard in plan.pieces for lo, hi in shard for i in range(lo, hi))
        assert rows == list(range(plan.used)), (samples, plan)
        assert {len(p) for p in plan.pieces} == {plan.steps}, "shards step unequally"
        sizes = [[hi - lo for lo, hi in p] for p in plan.pieces]
        assert all(1 <= s <= per_batch for p in sizes for s in p), (samples, sizes)
        for t in range(plan.steps):  # one step's pieces: within one row of each other
            step = [p[t] for p in sizes]
            assert max(step) - min(step) <= 1, (samples, sizes)
        # what is left out: only fewer than one a shard (b >= 2), or b = 1's S mod D
        left = samples % shards if per_batch == 1 or samples < shards else 0
        assert plan.samples - plan.used == left, (samples, plan)
        if plan.used == samples and samples:  # the fewest steps that hold them
            assert plan.steps == -(-samples // (shards * per_batch))


def _batch(first: int, n: int) -> dict[str, object]:
    ids = torch.arange(first, first + n)
    return {"x": (ids.float()[:, None] * torch.ones(n, 3), ids), "mask": ids % 2 == 0}


def test_rows_joined_and_cut_again_keep_the_structure() -> None:
    joined = join([_batch(0, 4), _batch(4, 1), _batch(5, 3)])
    assert not isinstance(joined, str), joined
    spec, leaves, rows = joined
    assert rows == 8
    got = pieces_of(spec, leaves, [(0, 3), (3, 8)])
    assert [int(i) for b in got for i in b["x"][1]] == list(range(8))
    assert isinstance(got[0]["x"], tuple) and got[1]["mask"].dtype == torch.bool
    assert torch.equal(got[1]["x"][0][:, 0], torch.arange(3, 8).float())


def test_a_leaf_that_is_not_a_tensor_is_named() -> None:
    batch = {"ids": torch.zeros(2), "text": ["a", "b"]}
    assert not_a_tensor(batch) == "batch['text'][0] (a str)"  # default_collate's strings
    assert not_a_tensor([torch.zeros(2), torch.ones(2)]) is None


def test_batches_that_cannot_be_joined_say_why() -> None:
    padded = [torch.zeros(2, 5), torch.zeros(2, 7)]  # padded to each batch's longest
    assert join(padded) == "its batches differ in structure or trailing shape"
    assert "no sample dimension" in str(join([torch.tensor(1.0)]))


@pytest.mark.parametrize("shards", [1, 2, 3, 4])
def test_a_saved_tail_is_dealt_among_another_number_of_shards(shards: int) -> None:
    def piece(lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.arange(lo, hi), torch.zeros(hi - lo)

    two = [[piece(0, 2), piece(2, 4)], [piece(4, 6), piece(6, 7)]]  # each saved shard's rest
    saved = SavedTail(two)
    parts = [saved.leftover(k, shards, per_batch=2) for k in range(shards)]
    ids = sorted(int(i) for p in parts for x, _ in p.left for i in x)
    assert ids == list(range(7))
    assert len({len(p.left) for p in parts}) == 1, "the shards step unequally"
    if shards == 2:  # as many shards as were saved: each its own batches, as they were
        assert [[id(b) for b in p.left] for p in parts] == [[id(b) for b in t] for t in two]
