"""The global-batch property of GlobalBatchSampler, including data sets that do not divide."""

from __future__ import annotations

import pytest
import torch

from disttrain.data import GlobalBatchSampler


@pytest.mark.parametrize("num_samples", [64, 100, 1437, 30])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 6])
def test_shards_of_every_step_form_the_same_global_batch_for_any_world_size(
    num_samples: int, world_size: int
) -> None:
    global_batch = 12  # divisible by every world size tried
    reference = GlobalBatchSampler(num_samples, global_batch, 0, 1, seed=3)
    shards = [
        GlobalBatchSampler(num_samples, global_batch, r, world_size, seed=3)
        for r in range(world_size)
    ]
    for epoch in range(3):
        expected = reference.epoch(epoch)
        per_rank = [s.epoch(epoch) for s in shards]
        assert all(len(steps) == num_samples // global_batch for steps in per_rank)
        for step, batch in enumerate(expected):
            together = torch.cat([steps[step] for steps in per_rank])
            assert torch.equal(together, batch)


def test_the_remainder_is_skipped_within_an_epoch_but_differs_between_epochs() -> None:
    sampler = GlobalBatchSampler(10, 4, 0, 1, seed=0)
    used = [torch.cat(sampler.epoch(e)) for e in range(2)]
    # 10 samples, batches of 4: two steps use 8 samples, 2 are left out of each epoch
    assert all(len(u) == 8 and len(set(u.tolist())) == 8 for u in used)
    left_out = [set(range(10)) - set(u.tolist()) for u in used]
    assert left_out[0] != left_out[1]


def test_each_epoch_is_reshuffled_from_the_seed() -> None:
    a = GlobalBatchSampler(50, 10, 0, 1, seed=1)
    b = GlobalBatchSampler(50, 10, 0, 1, seed=1)
    c = GlobalBatchSampler(50, 10, 0, 1, seed=2)
    assert torch.equal(torch.cat(a.epoch(0)), torch.cat(b.epoch(0)))
    assert not torch.equal(torch.cat(a.epoch(0)), torch.cat(a.epoch(1)))
    assert not torch.equal(torch.cat(a.epoch(0)), torch.cat(c.epoch(0)))


def test_a_batch_that_does_not_divide_among_workers_is_refused() -> None:
    with pytest.raises(ValueError, match="not divisible"):
        GlobalBatchSampler(100, 10, 0, 3)
