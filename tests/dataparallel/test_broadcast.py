"""broadcast_optimizer_state: every rank ends with root's state and hyper-parameters, as
Horovod's does (its test_broadcast_state checks each param group value, tuples included)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.harness import run_world


def _broadcast() -> dict[str, Any]:
    import torch.distributed as dist

    from disttrain.dataparallel.broadcast import broadcast_optimizer_state

    me = dist.get_rank()
    model = torch.nn.Linear(3, 2)
    # each rank its own hyper-parameters; only root has stepped (has moments)
    opt = torch.optim.Adam(
        model.parameters(), lr=0.1 * (me + 1), betas=(0.5 + 0.1 * me, 0.99), amsgrad=me == 0
    )
    if me == 0:
        model(torch.ones(4, 3)).sum().backward()
        opt.step()
    broadcast_optimizer_state(opt, root_rank=0)
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    moments = [s["exp_avg"].numpy().copy() for s in opt.state.values()]
    return {"group": group, "moments": moments}


@pytest.mark.timeout(120)
def test_every_rank_gets_root_s_hyper_parameters_tuples_included_and_its_moments() -> None:
    root, other = run_world(_broadcast, 2, timeout=90)
    assert other["group"] == root["group"]
    assert other["group"]["betas"] == (0.5, 0.99) and other["group"]["lr"] == 0.1
    assert isinstance(other["group"]["betas"], tuple)  # as torch keeps it
    assert len(other["moments"]) == len(root["moments"]) == 2
    for a, b in zip(other["moments"], root["moments"], strict=True):
        assert (a == b).all()
