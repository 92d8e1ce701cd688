"""BatchNorm's running statistics kept consistent by every data-parallel strategy (issue 49).

A Linear -> BatchNorm1d -> ReLU -> Linear model, each rank its own data (shifted and
scaled by rank, so the statistics differ), 2 workers, a few steps of each strategy built
directly (as the trainer drives it), in one shared world:

- allreduce, zero (stages 1 and 3): every rank's buffers after each step's forward are
  torch DDP's (``broadcast_buffers=True``: rank 0's broadcast before every forward), and
  after ``finish()`` every rank holds rank 0's;
- localsgd, diloco (whole and streaming): at each sync point every rank holds the mean of
  the replicas' buffers just before it;
- decentralized, ps (its servers a third rank): after ``finish()``, the mean;
- a model without buffers sends nothing more: no broadcast and no message in a
  synchronous step, one allreduce (the parameters') at a local SGD or DiLoCo sync.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import torch
from torch import nn

from tests.harness import SharedWorlds

STEPS = 4
Snapshot = list[list[float]]


def bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def plain_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(8, 6, generator=gen) * (1 + rank) + 2 * rank  # each rank's own statistics
    return x, torch.randint(0, 3, (8,), generator=gen)


def _buffers(model: nn.Module) -> Snapshot:
    from disttrain.dataparallel.buffers import floating_buffers

    return [b.detach().reshape(-1).tolist() for b in floating_buffers(model)]


def _ddp() -> dict[str, Any]:
    """torch DDP's buffers on this rank after each step's forward (the reference)."""
    from torch.nn.parallel import DistributedDataParallel

    from disttrain.train.trainer import loss_fn

    model = bn_model()
    ddp = DistributedDataParallel(model)  # broadcast_buffers=True, its default
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    rank = torch.distributed.get_rank()
    steps = []
    for step in range(1, STEPS + 1):
        optimizer.zero_grad()
        loss_fn(ddp(_batch(rank, step)[0]), _batch(rank, step)[1]).backward()
        optimizer.step()
        steps.append(_buffers(model))
    return {"steps": steps}


def _train(flags: dict[str, Any], model_fn: Callable[[], nn.Module]) -> dict[str, Any] | None:
    """``STEPS`` steps of the strategy as the trainer orders its hooks; this rank's buffers
    after each step's forward (``steps``), just before and after each ``after_step``
    (``before_sync``, ``after_sync``) and ``finish`` (``before_finish``, ``final``)."""
    import torch.distributed as dist

    import disttrain.strategies  # noqa: F401  (registers the settings sections)
    from disttrain import config, strategies
    from disttrain.comm import world
    from disttrain.strategies.capabilities import before_step
    from disttrain.train.trainer import loss_fn

    cfg = config.load({"batch_size": 16, **flags})
    model = model_fn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = strategies.get(cfg.train.strategy).build(cfg, world.current(), loss_fn)
    strategy.setup(model, optimizer)
    if not strategy.roles.is_worker:  # a parameter server
        strategy.roles.serve()
        return None
    _, limit = strategy.roles.limits(1, STEPS)
    out: dict[str, Any] = {"steps": [], "before_sync": [], "after_sync": []}
    for step in range(1, min(limit, STEPS) + 1):
        x, y = _batch(dist.get_rank(), step)
        before_step(strategy, step)
        optimizer.zero_grad(set_to_none=True)
        strategy.forward_backward(x, y)
        strategy.after_backward()
        optimizer.step()
        out["steps"].append(_buffers(model))
        strategy.after_step(step)
        out["after_sync"].append(_buffers(model))
    out["before_finish"] = _buffers(model)
    strategy.finish()
    out["final"] = _buffers(model)
    return out


def _collectives(flags: dict[str, Any]) -> dict[str, int]:
    """A model without buffers: the broadcasts and messages of ``before_step`` and
    ``finish`` (where the synchronous strategies send buffers), and the allreduces of one
    local SGD or DiLoCo sync (``after_step`` at period 1)."""
    import torch.distributed as dist

    import disttrain.strategies  # noqa: F401
    from disttrain import collectives, config, strategies
    from disttrain.comm import world
    from disttrain.comm.meter import meter
    from disttrain.strategies.capabilities import before_step
    from disttrain.train.trainer import loss_fn

    cfg = config.load({"batch_size": 16, **flags})
    model = plain_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = strategies.get(cfg.train.strategy).build(cfg, world.current(), loss_fn)
    strategy.setup(model, optimizer)
    counts = {"broadcast": 0, "all_reduce": 0}

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return fn(*args, **kwargs)

        return call

    x, y = _batch(dist.get_rank(), 1)
    with (
        mock.patch.object(dist, "broadcast", counted("broadcast", dist.broadcast)),
        mock.patch.object(collectives, "all_reduce", counted("all_reduce", collectives.all_reduce)),
    ):
        meter.reset()
        before_step(strategy, 1)
        edges = meter.messages_sent  # before_step alone
        broadcasts = counts["broadcast"]  # (ZeRO-3's gathers may broadcast in the step)
        optimizer.zero_grad(set_to_none=True)
        strategy.forward_backward(x, y)
        strategy.after_backward()
        optimizer.step()
        reduced = counts["all_reduce"]  # the gradients' (allreduce, zero: their reducer's)
        strategy.after_step(1)  # a local SGD or DiLoCo sync (period 1)
        synced = counts["all_reduce"] - reduced
        before, broadcasting = meter.messages_sent, counts["broadcast"]
        strategy.finish()
        edges += meter.messages_sent - before
        broadcasts += counts["broadcast"] - broadcasting
    return {"broadcasts": broadcasts, "edge_messages": edges, "sync_allreduces": synced}


#: name: the strategy's flags, 2 workers each (ps: and one server)
CASES: dict[str, dict[str, Any]] = {
    "allreduce": {"strategy": "allreduce"},
    "zero1": {"strategy": "zero", "zero_stage": 1},
    "zero3": {"strategy": "zero", "zero_stage": 3},
    "localsgd": {"strategy": "localsgd", "period": 2},
    "diloco": {"strategy": "diloco", "period": 2, "optimizer": "sgd"},
    "diloco_streaming": {"strategy": "diloco", "period": 2, "fragments": 2, "optimizer": "sgd"},
    "decentralized": {"strategy": "decentralized"},
}
SYNCHRONOUS = ("allreduce", "zero1", "zero3")
#: name: (the flags, the step numbers whose after_step syncs the buffers)
SYNCS = {"localsgd": (2, 4), "diloco": (2, 4), "diloco_streaming": (2, 4)}
QUIET = {
    "quiet_allreduce": {"strategy": "allreduce"},
    "quiet_zero3": {"strategy": "zero", "zero_stage": 3},
    "quiet_localsgd": {"strategy": "localsgd", "period": 1},
    "quiet_diloco": {"strategy": "diloco", "period": 1},
}


def _jobs() -> dict[str, tuple[int, Callable[..., Any], tuple[Any, ...]]]:
    jobs: dict[str, tuple[int, Callable[..., Any], tuple[Any, ...]]] = {"ddp": (2, _ddp, ())}
    for name, flags in CASES.items():
        jobs[name] = (2, _train, ({"workers": 2, **flags}, bn_model))
    for name, flags in QUIET.items():
        jobs[name] = (2, _collectives, ({"workers": 2, **flags},))
    ps = {"strategy": "ps", "workers": 2, "servers": 1, "ps_mode": "sync"}
    jobs["ps"] = (3, _train, (ps, bn_model))
    return jobs


WORLDS = SharedWorlds(_jobs(), timeout=240)


def _close(a: Snapshot, b: Snapshot, atol: float = 1e-5) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(torch.tensor(x), torch.tensor(y), rtol=0, atol=atol)


def _mean(snapshots: list[Snapshot]) -> Snapshot:
    return [torch.tensor(group).mean(0).tolist() for group in zip(*snapshots, strict=True)]


@pytest.mark.timeout(300)  # the first test spawns the shared world
@pytest.mark.parametrize("name", SYNCHRONOUS)
def test_synchronous_strategies_keep_ddp_s_buffers_and_end_with_rank_0_s(name: str) -> None:
    ddp, ours = WORLDS.get("ddp"), WORLDS.get(name)
    for rank in (0, 1):  # rank 1's forward starts from rank 0's statistics each step
        for step in range(STEPS):
            _close(ours[rank]["steps"][step], ddp[rank]["steps"][step])
    assert ours[0]["before_finish"] != ours[1]["before_finish"]  # the last forward's own
    for rank in (0, 1):
        _close(ours[rank]["final"], ddp[0]["steps"][-1])
        assert ours[rank]["final"] == ours[0]["final"]  # bit for bit


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(SYNCS))
def test_local_sgd_and_diloco_average_buffers_at_each_sync_point(name: str) -> None:
    ranks = WORLDS.get(name)
    for step in range(1, STEPS + 1):
        before = [r["steps"][step - 1] for r in ranks]
        after = [r["after_sync"][step - 1] for r in ranks]
        if step in SYNCS[name]:
            for mine in after:
                _close(mine, _mean(before), atol=1e-6)
            assert after[0] == after[1]
        else:  # between syncs each replica keeps its own
            assert after[0] != after[1] and after == before
    for r in ranks:  # the last step synced: finish has nothing left to do
        assert r["final"] == ranks[0]["final"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["decentralized", "ps"])
def test_decentralized_and_ps_end_with_the_workers_mean(name: str) -> None:
    workers = [r for r in WORLDS.get(name) if r is not None]  # ps: rank 2 serves
    assert len(workers) == 2
    before = [r["before_finish"] for r in workers]
    assert before[0] != before[1]
    for r in workers:
        _close(r["final"], _mean(before), atol=1e-6)
        assert r["final"] == workers[0]["final"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(QUIET))
def test_a_model_without_buffers_sends_nothing_more(name: str) -> None:
    for got in WORLDS.get(name):
        assert got["broadcasts"] == 0 and got["edge_messages"] == 0, got
        if name in ("quiet_localsgd", "quiet_diloco"):
            assert got["sync_allreduces"] == 1, got  # the parameters' (outer gradients') only
