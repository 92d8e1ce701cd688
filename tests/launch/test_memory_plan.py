"""The launcher's memory plan: what one worker is estimated to hold, and the refusal line.

The refusal through the command itself is a case of tests/test_bad_inputs.py
(``workers-over-memory``); here, the parts of the estimate against hand counts.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from disttrain import config
from disttrain.comm.errors import UsageError
from disttrain.data.datasets import Dataset
from disttrain.launch import memory_plan
from disttrain.launch.memory_plan import LAUNCHER_BYTES, PROCESS_BYTES, Plan


def _data() -> Dataset:
    x, y = torch.zeros(32, 4), torch.zeros(32, dtype=torch.long)
    return Dataset("toy", x, y, x[:8].clone(), y[:8].clone(), "classification", 3)


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))  # 67 parameters


def test_activations_are_every_leaf_output_per_sample() -> None:
    # 8 (Linear) + 8 (ReLU) + 3 (Linear) floats a sample
    assert memory_plan.activation_bytes(_model(), torch.zeros(5, 4)) == 19 * 4


@pytest.mark.parametrize(("optimizer", "copies"), [("sgd", 2), ("momentum", 3), ("adam", 4)])
def test_a_replica_holds_parameters_gradients_and_the_optimizer_s_state(
    optimizer: str, copies: int
) -> None:
    cfg = config.load({"workers": 4, "batch_size": 16, "optimizer": optimizer})
    plan = memory_plan.estimate(cfg, _model(), _data(), forked=True)
    assert plan.model_state == copies * 4 * 67
    assert plan.activations == 2 * (16 // 4) * 19 * 4  # output and its gradient
    assert plan.data == (32 * 4 + 8 * 4) * 4 + (32 + 8) * 8
    assert plan.process == PROCESS_BYTES["forked"]


def test_zero_stage_3_shards_the_state_the_strategy_s_own_formula() -> None:
    flags = {"workers": 4, "optimizer": "adam"}
    whole = memory_plan.estimate(config.load(flags), _model(), _data(), forked=False)
    sharded = config.load({**flags, "strategy": "zero", "zero_stage": 3})
    part = memory_plan.estimate(sharded, _model(), _data(), forked=False)
    assert part.model_state < whole.model_state
    assert part.process == PROCESS_BYTES["exec"]


def test_too_many_processes_are_refused_naming_the_most_that_fit() -> None:
    plan = Plan(process=100 << 20, model_state=0, data=0, activations=0)
    available = LAUNCHER_BYTES + 7 * plan.total + 1
    memory_plan.check(plan, 7, available)  # fits
    with pytest.raises(UsageError, match=r"^8 worker processes need about .* at most 7 fit"):
        memory_plan.check(plan, 8, available)


def test_more_processes_than_cores_get_one_warning_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    plan = Plan(process=1, model_state=0, data=0, activations=0)
    memory_plan.check(plan, 2, None)
    memory_plan.check(plan, 3, None, workers=2)  # 2 workers and a parameter server
    assert capsys.readouterr().err == ""
    memory_plan.check(plan, 3, None)
    err = capsys.readouterr().err
    assert err.startswith("warning: 3 workers on 2 cores") and err.count("\n") == 1
