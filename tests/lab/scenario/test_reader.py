"""Scenario files: each bad input is one line naming the file, table and key (exit 2)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from disttrain.lab.scenario import ScenarioError, load, parse
from disttrain.lab.scenario.reader import parse_rate, parse_strategy, scaled
from tests import zygote

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "scenario_bert_large.toml"
GOOD: dict[str, Any] = {
    "model": {"name": "resnet50"},
    "hardware": {
        "gpus_per_node": 4,
        "gpu_samples_per_second": 200.0,
        "intra_node": "pcie3",
        "inter_bandwidth": "25Gbit",
        "inter_fabric": "roce",
    },
    "run": {"gpus": 16, "batch_per_gpu": 64},
}


def _bad(table: str, key: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(GOOD)
    if value is None:
        del out[table][key]
    else:
        out[table][key] = value
    return out


CASES = [
    (_bad("model", "name", "resnet999"), "[model] name: 'resnet999' is not one of resnet50"),
    (_bad("model", "seq_len", 128), "[model] seq_len: is not a setting of resnet50"),
    (_bad("model", "depth", 3), "[model] depth: unknown key"),
    (_bad("hardware", "gpus_per_node", 0), "[hardware] gpus_per_node: must be a whole number"),
    (_bad("hardware", "gpu_tflops", 100.0), "give either gpu_samples_per_second or gpu_tflops"),
    (_bad("hardware", "intra_node", "nvlink9"), "[hardware] intra_node: 'nvlink9' is not one"),
    (_bad("hardware", "inter_bandwidth", "fast"), "inter_bandwidth: 'fast' is not a rate"),
    (_bad("hardware", "inter_bandwidth", 25), "must be a quoted string with its unit"),
    (_bad("hardware", "inter_fabric", "carrier-pigeon"), "inter_fabric: 'carrier-pigeon'"),
    (_bad("hardware", "inter_bandwidth", None), "[hardware] inter_bandwidth: is required"),
    (_bad("run", "gpus", 18), "[run] gpus: 18 is not a multiple of gpus_per_node 4"),
    (_bad("run", "strategy", "hybrid:tp=2"), "tensor parallelism is modelled for bert and gpt"),
    (_bad("run", "strategy", "hybrid:tp=2:pp=2:dp=2"), "dp*tp*pp = 8, not the 16 GPUs"),
    (_bad("run", "strategy", "magic"), "'magic': unknown strategy"),
    (_bad("run", "strategy", "localsgd"), "localsgd is not a scenario strategy"),
    (_bad("run", "precision", "fp8"), "[run] precision: 'fp8' is not one of fp32, amp"),
    (_bad("run", "batch_per_gpu", None), "give batch_per_gpu or global_batch"),
    (_bad("run", "global_batch", 1000), "1000 is not a multiple of batch_per_gpu 64"),
    (_bad("run", "overlap", "yes"), "[run] overlap: must be true or false"),
]


@pytest.mark.parametrize(("data", "message"), CASES, ids=[c[1][:40] for c in CASES])
def test_each_bad_value_is_named(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse(data, "my.toml")
    text = str(err.value)
    assert message in text and text.startswith("my.toml: ") and "\n" not in text


def test_a_missing_table_and_an_unknown_one() -> None:
    with pytest.raises(ScenarioError, match=r"\[run\]: the table is missing"):
        parse({"model": GOOD["model"], "hardware": GOOD["hardware"]})
    with pytest.raises(ScenarioError, match=r"\[cluster\]: unknown table"):
        parse({**GOOD, "cluster": {}})


def test_rates_and_strategies() -> None:
    assert parse_rate("100Gbit") == pytest.approx(12.5e9)
    assert parse_rate("200Gb/s") == pytest.approx(25e9)
    assert parse_rate("25GB/s") == pytest.approx(25e9)
    assert parse_strategy("hybrid:tp=8:pp=16:dp=8", 1024) == (8, 8, 16, 1, 0)
    assert parse_strategy("zero:3", 64) == (64, 1, 1, 1, 3)
    assert parse_strategy("hybrid:pp=4", 16) == (4, 1, 4, 1, 0)
    assert parse_strategy("hybrid:tp=4", 16) == (4, 4, 1, 1, 0)
    assert parse_strategy("hybrid:tp=2:pp=2:virtual_stages=3", 8) == (2, 2, 2, 3, 0)
    assert parse_strategy("allreduce", 8) == (8, 1, 1, 1, 0)
    assert parse_strategy("zero", 8) == (8, 1, 1, 1, 1)  # --zero-stage's default
    assert parse_strategy("tensor", 8) == (1, 8, 1, 1, 0)
    assert parse_strategy("pipeline", 8) == (1, 1, 8, 1, 0)


@pytest.mark.parametrize(
    ("text", "gpus", "message"),
    [
        ("hybrid:tp=3", 16, "'hybrid:tp=3': tp*pp = 3 does not divide the 16 GPUs"),
        ("hybrid:tp=2:dp=3", 16, "'hybrid:tp=2:dp=3': dp*tp*pp = 6, not the 16 GPUs"),
        ("hybrid:dp=4", 4, "'hybrid:dp=4': hybrid needs tp=T or pp=P"),
        ("hybrid:tp=-2", 4, "'hybrid:tp=-2': tp=-2 must be at least 0"),
        ("hybrid:pp=2:virtual_stages=0", 4, "virtual-stages=0 must be at least 1"),
        ("hybrid:tp=2:schedule=1f1b", 4, "the scenario model of hybrid does not read schedule"),
        ("zero:4", 8, "'zero:4': zero-stage=4: ZeRO stages are 1, 2 and 3"),
        ("zero:0", 8, "zero-stage=0: ZeRO stages are 1, 2 and 3"),
        ("zero:x", 8, "'zero:x': zero-stage='x' is not a int"),
        ("allreduce:ring", 8, "the scenario model of allreduce does not read algorithm"),
        ("tensor:2", 8, "the scenario model of tensor does not read tensor-mode"),
        ("pipeline:4", 8, "the scenario model of pipeline does not read schedule"),
        ("hybrid:tp=2:colour=red", 8, "'colour' is not a train setting"),
        ("ps", 8, "'ps': ps is not a scenario strategy"),
    ],
)
def test_a_strategy_the_scenario_cannot_lay_out_is_one_line(
    text: str, gpus: int, message: str
) -> None:
    with pytest.raises(ValueError) as err:
        parse_strategy(text, gpus)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith(f"{text!r}: ")


def test_a_stated_data_parallel_part_is_scaled_and_an_unstated_one_is_kept() -> None:
    assert scaled("hybrid:tp=8:pp=2:dp=4", 128) == "hybrid:tp=8:pp=2:dp=8"
    assert scaled("hybrid:dp=4:tp=8", 16) == "hybrid:dp=2:tp=8"
    assert scaled("hybrid:tp=8", 16) == "hybrid:tp=8"
    assert scaled("zero:3", 16) == "zero:3"
    with pytest.raises(ValueError, match=r"'hybrid:tp=8:dp=2': tp\*pp = 8 does not divide the 12"):
        scaled("hybrid:tp=8:dp=2", 12)


def test_global_batch_alone_sets_the_batch_per_gpu() -> None:
    sc = parse({**GOOD, "run": {"gpus": 16, "global_batch": 2048, "accumulation": 2}})
    assert (sc.run.batch_per_gpu, sc.run.accumulation, sc.run.global_batch) == (64, 2, 2048)


#: GOOD without its one-GPU rate, timed instead on one node of 4 GPUs
MEASURED: dict[str, Any] = {
    **copy.deepcopy(GOOD),
    "measured": {"gpus": 4, "samples_per_second": 700.0},
}
del MEASURED["hardware"]["gpu_samples_per_second"]


def test_a_measured_run_gives_back_the_one_gpu_rate_that_predicts_it() -> None:
    from disttrain.lab.scenario import predict

    sc = parse(MEASURED)
    assert sc.measured is not None and sc.measured.run.gpus == 4
    assert sc.measured.run.batch_per_gpu == 64 and sc.run.gpus == 16
    rate = sc.hardware.gpu_samples_per_second
    assert rate is not None and rate > 700.0 / 4  # 4 GPUs lose a little to synchronisation
    # with that rate stated, the 4-GPU run is predicted at the figure it was backed out of
    stated = copy.deepcopy(GOOD)
    stated["hardware"]["gpu_samples_per_second"] = rate
    stated["run"]["gpus"] = 4
    assert predict(parse(stated)).samples_per_second == pytest.approx(700.0, rel=1e-9)
    stated["run"]["gpus"] = 16  # and the 16-GPU run as the measured scenario predicts it
    assert predict(parse(stated)).samples_per_second == pytest.approx(
        predict(sc).samples_per_second, rel=1e-12
    )


def test_a_measured_run_keeps_its_own_global_batch_when_it_gives_one() -> None:
    weak = parse(MEASURED)  # [run]'s batch per GPU and accumulation: the global batch grows
    assert weak.measured is not None and weak.measured.run.global_batch == 4 * 64
    fixed = _measured(measured__global_batch=16 * 64)  # strong scaling: [run]'s 1024
    sc = parse(fixed)
    assert sc.measured is not None
    assert (sc.measured.run.batch_per_gpu, sc.measured.run.accumulation) == (64, 4)
    fixed["run"].update(global_batch=2048, accumulation=2)  # [run]'s own: 16 x 64 x 2
    fixed["measured"]["global_batch"] = 2048  # the same global batch on 4 GPUs
    sc = parse(fixed)
    assert sc.measured is not None and sc.measured.run.accumulation == 8


def test_a_layout_error_of_the_measured_run_names_its_gpus() -> None:
    data = copy.deepcopy(MEASURED)
    data["model"] = {"name": "gpt", "layers": 8, "hidden": 1024, "heads": 8, "seq_len": 512}
    data["hardware"]["gpus_per_node"] = 8
    data["run"] = {"gpus": 16, "batch_per_gpu": 2, "strategy": "hybrid:tp=8"}
    data["measured"] = {"gpus": 4, "samples_per_second": 20.0}  # [run]'s hybrid:tp=8 on 4 GPUs
    with pytest.raises(ScenarioError) as err:
        parse(data, "my.toml")
    assert str(err.value) == (
        "my.toml: [measured] gpus: 'hybrid:tp=8': tp*pp = 8 does not divide the 4 GPUs"
    )


def test_a_hybrid_measured_run_scales_its_data_parallel_part() -> None:
    data = copy.deepcopy(MEASURED)
    data["model"] = {"name": "gpt", "layers": 8, "hidden": 1024, "heads": 8, "seq_len": 512}
    data["run"] = {
        "gpus": 16,
        "batch_per_gpu": 2,
        "strategy": "hybrid:tp=2:pp=2:dp=4:virtual_stages=2",
    }
    data["measured"] = {"gpus": 4, "samples_per_second": 20.0}
    sc = parse(data)
    assert sc.measured is not None
    assert sc.measured.run.strategy == "hybrid:tp=2:pp=2:dp=1:virtual_stages=2"
    assert (sc.measured.run.dp, sc.run.dp) == (1, 4)
    data["measured"]["gpus"] = 6  # no layout of tp 2 x pp 2 on 6 GPUs
    with pytest.raises(
        ScenarioError, match=r"\[measured\] gpus: '.*': tp\*pp = 4 does not divide the 6 GPUs; give"
    ):
        parse(data)


def _measured(**change: Any) -> dict[str, Any]:
    out = copy.deepcopy(MEASURED)
    for key, value in change.items():
        table, name = key.split("__")
        out[table][name] = value
    return out


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            _measured(hardware__gpu_tflops=100.0),
            "[hardware] gpu_tflops: is backed out of [measured]: give one or the other",
        ),
        (_measured(measured__gpus=0), "[measured] gpus: must be a whole number of at least 1"),
        (_measured(measured__gpus=6), "[measured] gpus: 6 is not a multiple of gpus_per_node 4"),
        (_measured(measured__strategy="magic"), "[measured] strategy: 'magic': unknown strategy"),
        (_measured(measured__samples_per_second=-1), "[measured] samples_per_second: must be"),
        (_measured(measured__seconds=1), "[measured] seconds: unknown key"),
        (
            _measured(measured__samples_per_second=1e9),
            "[measured] samples_per_second: 1e+09 is above what 4 GPUs reach at any GPU speed",
        ),
        (
            _measured(measured__samples_per_second=1e-12),
            "[measured] samples_per_second: 1e-12 is below what 4 GPUs reach at 1e-09",
        ),
        ({**_measured(), "measured": {"gpus": 4}}, "[measured] samples_per_second: is required"),
        ({**_measured(), "measured": 5}, "my.toml: [measured]: must be a table"),
        (_measured(measured__global_batch=1000), "[measured] global_batch: 1000 is not a multiple"),
    ],
    ids=[
        "rate-too",
        "gpus-0",
        "gpus-6",
        "strategy",
        "negative",
        "unknown",
        "too-fast",
        "too-slow",
        "no-figure",
        "not-a-table",
        "global-batch",
    ],
)
def test_a_bad_measured_run_is_named(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse(data, "my.toml")
    text = str(err.value)
    assert text.startswith("my.toml: ") and message in text and "\n" not in text


def test_the_example_file_loads() -> None:
    sc = load(str(EXAMPLE))
    assert sc.run.accumulation == 1 and sc.hardware.nics_per_node == 8


def _disttrain(*args: str) -> Any:
    return zygote.run(
        [sys.executable, "-m", "disttrain", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_the_command_refuses_a_bad_file_in_one_line_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\nname = "resnet50"\n[hardware]\ngpus_per_node = "eight"\n[run]\n')
    done = _disttrain("advise", "--scenario", str(bad))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0] == (
        f"disttrain: error: {bad}: [hardware] gpus_per_node: must be a whole number of at "
        "least 1, got 'eight'"
    )


def test_the_command_writes_the_json(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = _disttrain("advise", "--scenario", str(EXAMPLE), "--json", str(out))
    assert done.returncode == 0, done.stderr
    got = json.loads(out.read_text())
    assert set(got) == {"samples_per_second", "scaling_efficiency", "step_seconds", "breakdown"}
    assert 100_000 < got["samples_per_second"] < 200_000
    assert "samples/s" in done.stdout


def test_a_model_or_cluster_flag_beside_the_scenario_is_refused() -> None:
    # the file describes the whole run: --params here was silently unread before
    done = _disttrain("advise", "--scenario", str(EXAMPLE), "--params", "25M", "--nodes", "4")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "disttrain: error: --params is not read with --scenario: the file describes the whole run"
    )


def test_a_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no such scenario file"):
        load(str(tmp_path / "none.toml"))
    broken = tmp_path / "broken.toml"
    broken.write_text("[model\nname = 1\n")
    with pytest.raises(ScenarioError, match="not valid TOML") as err:
        load(str(broken))
    assert "\n" not in str(err.value)
