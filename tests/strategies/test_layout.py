"""Process layouts: every process trains by default; the parameter server's own roles."""

from __future__ import annotations

from disttrain import config, strategies
from disttrain.strategies.layout import Layout
from disttrain.strategies.ps import ServerLayout


def test_default_layout_every_process_trains() -> None:
    cfg = config.load({"strategy": "allreduce", "workers": 3})
    for name in strategies.STRATEGIES:
        if name != "ps":
            assert strategies.get(name).layout is Layout, name
    assert Layout.num_processes(cfg) == 3
    assert not any(Layout.survives_loss_of(cfg, r) for r in range(3))


def test_parameter_server_layout() -> None:
    assert strategies.get("ps").layout is ServerLayout
    sync = config.load({"strategy": "ps", "workers": 3, "servers": 2})
    asyn = config.load({"strategy": "ps", "workers": 3, "servers": 2, "ps_mode": "async"})
    assert ServerLayout.num_processes(sync) == 5  # workers + servers
    assert not any(ServerLayout.survives_loss_of(sync, r) for r in range(5))
    # async goes on without a worker, never without rank 0 (the summary) or a server
    assert [ServerLayout.survives_loss_of(asyn, r) for r in range(5)] == [
        False,
        True,
        True,
        False,
        False,
    ]
