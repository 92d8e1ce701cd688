"""Which buffers the strategies keep equal: persistent floating ones (running statistics),
each tensor once; counts apart; non-persistent constants never. The collectives themselves
are tested through the strategies (tests/strategies/test_batch_norm_buffers.py)."""

from __future__ import annotations

import torch
from torch import nn

from disttrain.dataparallel.buffers import (
    average_buffers,
    broadcast_buffers,
    floating_buffers,
    integer_buffers,
)


class _Rotary(nn.Module):
    """A derived constant, as Hugging Face models register theirs: not persistent."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", torch.ones(4), persistent=False)
        self.register_buffer("ema", torch.zeros(2))  # a persistent statistic of its own


def test_running_statistics_count_counts_apart_constants_never() -> None:
    bn = nn.BatchNorm1d(3)
    shared = nn.BatchNorm1d(2)
    rotary = _Rotary()
    model = nn.Sequential(bn, shared, rotary, shared)  # a module used twice
    got = floating_buffers(model)
    want = [bn.running_mean, bn.running_var, shared.running_mean, shared.running_var]
    assert [id(t) for t in got] == [id(t) for t in [*want, rotary.ema]]
    counts = integer_buffers(model)
    assert [id(t) for t in counts] == [id(bn.num_batches_tracked), id(shared.num_batches_tracked)]


def test_a_model_without_them_or_one_rank_sends_nothing() -> None:
    plain = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    assert floating_buffers(plain) == [] and integer_buffers(plain) == []
    # no process group at all: nothing is asked of torch.distributed
    assert broadcast_buffers(plain) is False
    assert average_buffers(plain) is False
