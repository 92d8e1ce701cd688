"""The pipeline's cost model (``disttrain advise``): each schedule's own bubble and memory terms."""

from __future__ import annotations

import math

import pytest

from disttrain.cli import main
from disttrain.lab import costmodel
from disttrain.lab.calibration import Calibration
from disttrain.parallel.pipeline import SCHEDULES

CAL = Calibration.defaults()
NET = costmodel.Network(alpha=5e-6, beta=8 / 10e9, gamma=0.0)
WORK = costmodel.Workload(params=25_000_000, batch_size=128)


def _predict(spec: str, nodes: int = 4) -> costmodel.Prediction:
    return costmodel.predict(spec, WORK, nodes, NET, CAL)


def test_each_schedule_adds_its_own_bubble_to_the_same_work() -> None:
    p, m = 4, 4  # train's default M
    busy = WORK.batch_size * WORK.flops * CAL.seconds_per_flop / p
    own = WORK.params / p * CAL.seconds_per_param + CAL.seconds_per_step
    for spec, name, v in [
        ("pipeline:1f1b", "1f1b", 1),
        ("pipeline:gpipe", "gpipe", 1),
        ("pipeline:interleaved:virtual_stages=2", "interleaved", 2),
        ("pipeline:zb1", "zb1", 1),
        ("pipeline:zb2", "zb2", 1),
    ]:
        pred = _predict(spec, p)
        bubble = SCHEDULES.get(name).bubble(m, p, v)
        assert pred.compute_seconds == pytest.approx(busy / (1 - bubble) + own), spec
        assert f"bubble {bubble:.1%}" in pred.reason
        assert f"holds {SCHEDULES.get(name).held(m, p, v, 0):g} micro-batches" in pred.reason
    steps = {s: _predict(f"pipeline:{s}").step_seconds for s in ("1f1b", "zb1", "zb2")}
    steps["interleaved"] = _predict("pipeline:interleaved:virtual_stages=2").step_seconds
    # (P-1)/(M+P-1) > (P-1)/(MV+P-1) > (P-1)/(3M+P-1): 1F1B, interleaved, ZB-H1 = ZB-H2 (F=B=W)
    assert steps["1f1b"] > steps["interleaved"] > steps["zb1"] == pytest.approx(steps["zb2"])
    assert _predict("pipeline:1f1b:microbatches=64").step_seconds < steps["1f1b"]


def test_advise_lists_the_schedules_with_different_times(capsys: pytest.CaptureFixture[str]):
    assert (
        main(
            [
                "advise",
                "--params",
                "25M",
                "--nodes",
                "4",
                "--bandwidth",
                "10Gbit",
                "--latency",
                "5us",
                "--json",
                "/dev/null",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for row in ("pipeline:1f1b", "pipeline:zb1", "pipeline:zb2", "pipeline:interleaved"):
        assert row in out
    rows = {
        p.strategy: p for p in costmodel.rank(costmodel.default_strategies(), WORK, 4, NET, CAL)
    }
    times = [rows[f"pipeline:{s}"].step_seconds for s in ("1f1b", "zb1")]
    assert times[0] != times[1]


def test_activations_cost_the_hand_offs_and_one_stage_sends_none() -> None:
    small = _predict("pipeline:1f1b:activation_bytes=1000")
    big = _predict("pipeline:1f1b:activation_bytes=1e6")
    m, p = 4, 4
    message = WORK.batch_size / m * 1000
    assert small.comm_seconds == pytest.approx(2 * (p - 1) * (NET.alpha + message * NET.beta))
    assert small.bytes_per_rank == pytest.approx(2 * m * message)
    assert big.comm_seconds > small.comm_seconds
    unstated = _predict("pipeline:1f1b")  # 4·sqrt(params) bytes a sample, said in the note
    assert f"{4 * math.sqrt(WORK.params):.3g} B" in unstated.note
    one = _predict("pipeline:interleaved:virtual_stages=2", nodes=1)
    assert one.comm_seconds == 0 and one.bytes_per_rank == 0


def test_unstated_microbatches_rise_to_what_the_schedule_runs() -> None:
    # train's default M = 4: interleaved on 8 ranks needs a multiple of 8, zb2 at least 8
    assert "at M=8, V=2" in _predict("pipeline:interleaved:virtual_stages=2", nodes=8).reason
    assert "at M=8, V=1" in _predict("pipeline:zb2", nodes=8).reason
    assert "at M=4, V=1" in _predict("pipeline:1f1b", nodes=8).reason


def test_sizes_a_schedule_refuses_and_settings_it_does_not_read() -> None:
    with pytest.raises(ValueError, match="multiple of the 4 stages"):
        _predict("pipeline:interleaved:virtual_stages=2:microbatches=6")
    with pytest.raises(ValueError, match="zb2 needs at least as many micro-batches"):
        _predict("pipeline:zb2:microbatches=2")
    with pytest.raises(ValueError, match="does not read lr"):
        _predict("pipeline:zb1:lr=0.5")


def test_compare_and_advise_read_the_same_schedule_specs() -> None:
    from disttrain.strategies.spec import parse_specs

    text = "pipeline:zb1:microbatches=8, pipeline:interleaved:virtual-stages=2"
    runs = parse_specs(text)  # compare: train runs
    assert [r.settings for r in runs] == [
        {"schedule": "zb1", "microbatches": 8},
        {"schedule": "interleaved", "virtual_stages": 2},
    ]
    modelled = parse_specs(text, model=True)  # advise: the same settings, predicted
    assert [r.settings for r in modelled] == [r.settings for r in runs]
    assert "M=8" in costmodel.predict(modelled[0], WORK, 4, NET, CAL).reason


def test_an_uneven_balance_is_paced_by_its_slowest_stage() -> None:
    # four stages of 2/1/1/1 equal layers: stage 0 does 2/5 of the work, not 1/4; an even
    # list is the closed form exactly; balance=time is said to be modelled as equal
    m = 4
    even = _predict("pipeline:1f1b")
    assert _predict("pipeline:1f1b:balance=1/1/1/1").compute_seconds == pytest.approx(
        even.compute_seconds
    )
    assert _predict("pipeline:zb1:balance=3/3/3/3").step_seconds == pytest.approx(
        _predict("pipeline:zb1").step_seconds
    )
    uneven = _predict("pipeline:1f1b:balance=2/1/1/1")
    # two stages of 1/2 layers: the last does 2/3 of the work and never waits once its
    # first input is there, so the step is its work plus the first stage's F and B of one
    # micro-batch ((1/3)·whole/M) before and after it
    whole = WORK.batch_size * WORK.flops * CAL.seconds_per_flop  # all the work on one rank
    two = _predict("pipeline:1f1b:balance=1/2", nodes=2)
    own = WORK.params * 2 / 3 * CAL.seconds_per_param + CAL.seconds_per_step
    assert two.compute_seconds == pytest.approx(whole * 2 / 3 + whole / 3 / m + own)
    assert uneven.step_seconds > even.step_seconds
    assert "stages of 2/1/1/1 layers" in uneven.note
    assert "equal stages assumed" in _predict("pipeline:1f1b:balance=time").note
    with pytest.raises(ValueError, match="lists 3 stages, not 4"):
        _predict("pipeline:1f1b:balance=1/1/1")


def test_advise_cuts_the_work_by_its_models_parameters() -> None:
    # advise's stand-in: 10 Linear layers with a ReLU between (19 layers); 7/4/4/4 puts 4
    # Linears on stage 0 and 2 on each other: the shares of 2/1/1/1 equal layers
    from disttrain.strategies.spec import parse_specs

    model = costmodel.equal_layers(WORK.params, 10)
    specs = parse_specs("pipeline:1f1b:balance=7/4/4/4", model=True)
    (row,) = costmodel.assess(specs, WORK, 4, NET, CAL, model)
    assert row.step is not None and row.memory is not None
    want = _predict("pipeline:1f1b:balance=2/1/1/1")  # no model known: shares of the layers
    assert row.step.compute_seconds == pytest.approx(want.compute_seconds)
