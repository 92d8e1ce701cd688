"""Loss scaling: the scaler's arithmetic, and an overflow on one rank skipping the step on all."""

from __future__ import annotations

import pytest
import torch

from disttrain.amp import LossScaler, NonFiniteLoss
from tests.harness import SharedWorlds


def test_an_overflow_halves_the_scale_and_clean_steps_grow_it_back() -> None:
    scaler = LossScaler(init_scale=1024.0, growth_interval=3)
    scaler.update(found_inf=True)
    assert scaler.scale == 512.0
    for _ in range(2):
        scaler.update(found_inf=False)
    assert scaler.scale == 512.0  # not yet: growth needs 3 clean steps
    scaler.update(found_inf=False)
    assert scaler.scale == 1024.0 and scaler.clean_steps == 0


def test_persistent_overflow_ends_the_run_with_a_clear_error() -> None:
    scaler = LossScaler(init_scale=8.0, max_skipped_steps=3)
    scaler.update(True)
    scaler.update(True)
    with pytest.raises(NonFiniteLoss, match="3 steps in a row"):
        scaler.update(True)


def test_a_scale_under_its_minimum_ends_the_run() -> None:
    scaler = LossScaler(init_scale=1.0, min_scale=0.3, max_skipped_steps=100)
    scaler.update(True)
    with pytest.raises(NonFiniteLoss, match="use --precision bf16"):
        scaler.update(True)


def test_unscale_divides_gradients_and_reports_non_finite_ones() -> None:
    p = torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.tensor([2.0, 4.0, 8.0])
    scaler = LossScaler(init_scale=2.0)
    assert scaler.unscale_([p]) is False
    assert p.grad.tolist() == [1.0, 2.0, 4.0]
    p.grad = torch.tensor([1.0, float("inf"), 0.0])
    assert scaler.unscale_([p]) is True


def test_state_round_trips() -> None:
    a = LossScaler(init_scale=64.0)
    a.update(True)
    b = LossScaler()
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()


def _overflow_on_one_rank(compression: str) -> list[tuple[float, bool, list[float]]]:
    import torch.distributed as dist

    from disttrain import config, strategies
    from disttrain.comm import world
    from disttrain.train.metrics import Timers
    from disttrain.train.step import StepRunner
    from disttrain.train.trainer import loss_fn

    cfg = config.load(
        {"precision": "fp16", "scale_growth_interval": 2, "workers": 2, "compression": compression}
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = strategies.get("allreduce").build(cfg, world.current(), loss_fn)
    strategy.setup(model, optimizer)
    runner = StepRunner(strategy, optimizer, cfg.train, Timers(), None, dist.get_rank())
    assert runner.scaler is not None
    trace = []
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    for step in range(1, 5):
        xs = x.clone()
        if step == 2 and dist.get_rank() == 1:
            xs[0, 0] = float("inf")  # one rank's gradient overflows
        _, skipped = runner.run(step, xs, y)
        params = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
        trace.append((runner.scaler.scale, skipped, params))
    return trace


COMPRESSIONS = ("none", "fp16", "bf16")  # buckets in 32 or 16 bits
#: the three in one world of 2 ranks (1 spawn instead of 3; each seeds and builds its own)
RUNS = SharedWorlds({c: (2, _overflow_on_one_rank, (c,)) for c in COMPRESSIONS}, timeout=150)


@pytest.mark.timeout(200)  # the first case runs the shared world
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_an_inf_on_one_rank_makes_every_rank_skip_and_back_off_together(compression: str) -> None:
    traces = RUNS.get(compression)
    assert traces[0] == traces[1]  # same decisions, same scale, same parameters
    scales = [t[0] for t in traces[0]]
    skipped = [t[1] for t in traces[0]]
    params = [t[2] for t in traces[0]]
    assert skipped == [False, True, False, False]
    assert params[1] == params[0]  # the skipped step left the parameters alone
    assert params[2] != params[1]
    assert scales == [65536.0, 32768.0, 32768.0, 65536.0]  # halved, then grown after 2 clean


def test_bf16_on_a_cpu_without_native_bf16_is_warned_with_the_measured_cost(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import math

    from disttrain import amp
    from disttrain.config import load
    from disttrain.launch.preflight import preflight

    ratio = amp.bf16_cpu_slowdown()  # a ratio of paired timings, not a time
    assert math.isfinite(ratio) and ratio > 0
    assert amp.bf16_warning(1.2) == ""  # native bf16: nothing to say
    line = amp.bf16_warning(12.4)
    assert "has no native bf16; a bf16 matmul took 12x the fp32 time here" in line
    monkeypatch.setattr(amp, "bf16_cpu_slowdown", lambda: 25.0)  # what this AVX2 CPU shows
    preflight(load({"precision": "bf16"}))
    err = capsys.readouterr().err
    assert err.startswith("disttrain: warning: --precision bf16: this CPU (") and "25x" in err
    preflight(load({"precision": "fp32"}))
    assert capsys.readouterr().err == ""  # fp32 pays nothing
