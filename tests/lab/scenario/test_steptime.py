"""The step model's parts: compute from the one-GPU rate, overlap, bubbles, the JSON."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from disttrain.lab.scenario import parse, predict
from disttrain.lab.scenario.steptime import SYNC_PER_DOUBLING

CNN: dict[str, Any] = {
    "model": {"name": "resnet50"},
    "hardware": {"gpus_per_node": 8, "gpu_samples_per_second": 400.0, "intra_node": "pcie3"},
    "run": {"gpus": 8, "batch_per_gpu": 100, "precision": "fp32"},
}
GPT: dict[str, Any] = {
    "model": {"name": "gpt", "layers": 8, "hidden": 1024, "heads": 16, "seq_len": 1024},
    "hardware": {
        "gpus_per_node": 8,
        "gpu_tflops": 100.0,
        "intra_node": "nvswitch-a100",
        "inter_bandwidth": "200Gbit",
        "inter_fabric": "infiniband",
    },
    "run": {"gpus": 16, "batch_per_gpu": 2, "global_batch": 64, "precision": "bf16"},
}


def _with(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        table, name = key.split("__")
        out[table][name] = value
    return out


def test_the_json_has_the_issue_s_shape() -> None:
    p = predict(parse(CNN)).as_json()
    assert set(p) == {"samples_per_second", "scaling_efficiency", "step_seconds", "breakdown"}
    assert all(isinstance(p[k], float) for k in ("samples_per_second", "step_seconds"))
    assert p["samples_per_second"] == pytest.approx(800 / p["step_seconds"])
    assert 0 < p["scaling_efficiency"] <= 1


def test_an_overlapped_resnet_step_is_its_compute_and_the_log_p_wait() -> None:
    p = predict(parse(CNN))
    compute = 100 / 400.0  # one micro-batch at the one-GPU rate
    assert p.breakdown["compute_seconds"] == pytest.approx(compute)
    assert p.breakdown["sync_seconds"] == pytest.approx(SYNC_PER_DOUBLING * 3 * compute)
    assert p.breakdown["data_parallel_exposed_seconds"] < 0.01 * compute  # hidden by backward


def test_without_overlap_the_whole_allreduce_shows() -> None:
    p = predict(parse(_with(CNN, run__overlap=False)))
    b = p.breakdown
    assert b["data_parallel_exposed_seconds"] == pytest.approx(b["data_parallel_seconds"])


def test_gpu_tflops_sets_compute_by_megatron_flops() -> None:
    p = predict(parse(_with(GPT, run__strategy="allreduce")))
    s, n, h, v = 1024, 8, 1024, 51200
    flops = 72 * s * n * h * h * (1 + s / (6 * h)) + 6 * s * h * v  # per sequence
    per_step = 2 * 2 * flops / 100e12  # batch 2, 64 / (16 x 2) = 2 micro-batches
    assert p.breakdown["compute_seconds"] == pytest.approx(per_step)
    assert p.breakdown["micro_batches"] == 2


def test_accumulation_hides_more_of_the_allreduce() -> None:
    one = predict(parse(_with(GPT, run__strategy="allreduce", run__global_batch=32)))
    four = predict(parse(_with(GPT, run__strategy="allreduce", run__global_batch=128)))
    assert four.scaling_efficiency > one.scaling_efficiency


def test_tensor_parallel_allreduces_are_on_the_critical_path() -> None:
    p = predict(parse(_with(GPT, run__strategy="hybrid:tp=2:pp=1:dp=8")))
    assert p.breakdown["tensor_parallel_seconds"] > 0
    hidden = predict(parse(_with(GPT, run__strategy="hybrid:tp=2:pp=1:dp=8", run__tp_overlap=True)))
    assert hidden.step_seconds < p.step_seconds


def test_the_pipeline_bubble_is_pp_minus_one_micro_batches_over_vp() -> None:
    sc = _with(GPT, run__strategy="hybrid:tp=1:pp=4:dp=4", run__global_batch=64)
    p = predict(parse(sc))
    b = p.breakdown
    per_mb = (b["compute_seconds"] + b["pipeline_p2p_seconds"]) / b["micro_batches"]
    assert b["pipeline_bubble_seconds"] == pytest.approx(3 * per_mb)
    inter = predict(parse(_with(GPT, run__strategy="hybrid:tp=1:pp=4:dp=4:virtual_stages=2")))
    assert inter.breakdown["pipeline_bubble_seconds"] < b["pipeline_bubble_seconds"]


def test_zero_3_gathers_every_layer_and_tcp_is_slower_than_infiniband() -> None:
    ib = predict(parse(_with(GPT, run__strategy="zero:3")))
    assert ib.breakdown["data_parallel_seconds"] > 0
    tcp = copy.deepcopy(GPT)
    tcp["hardware"]["inter_fabric"] = "tcp"
    tcp["run"]["strategy"] = "zero:3"
    assert (
        predict(parse(tcp)).breakdown["data_parallel_seconds"]
        > ib.breakdown["data_parallel_seconds"]
    )


def test_model_tflops_per_gpu_is_flops_times_rate() -> None:
    p = predict(parse(_with(GPT, run__strategy="allreduce")))
    assert math.isclose(p.breakdown["model_tflops_per_gpu"], 100 * p.scaling_efficiency)


def test_a_cnn_pipeline_sends_the_activations_at_its_cut() -> None:
    p = predict(parse(_with(CNN, run__strategy="hybrid:pp=2")))
    # the cut at half the FLOPs falls after ResNet-50's layer3: 1024 x 14 x 14 per image,
    # fp32, 100 images, forward and back over PCIe 3 (10 GB/s, 5 us)
    one_way = 5e-6 + 100 * 1024 * 14 * 14 * 4 / 10e9
    assert p.breakdown["pipeline_p2p_seconds"] == pytest.approx(2 * one_way)


def test_amp_s_shorter_backward_hides_less_of_the_same_allreduce() -> None:
    # AMP keeps fp32 gradients (the same bytes) but its one-GPU rate is 3x: each bucket's
    # backward time shrinks with it, so more of the allreduce outlasts backward
    bert = {
        "model": {"name": "bert-large"},
        "hardware": {
            "gpus_per_node": 8,
            "gpu_samples_per_second": 20.0,
            "intra_node": "nvlink-v100",
            "inter_bandwidth": "100Gbit",
            "inter_fabric": "infiniband",
        },
        "run": {"gpus": 32, "batch_per_gpu": 16, "precision": "fp32"},
    }
    fp32 = predict(parse(bert)).breakdown
    amp = predict(
        parse(_with(bert, hardware__gpu_samples_per_second=60.0, run__precision="amp"))
    ).breakdown
    assert amp["data_parallel_seconds"] == pytest.approx(fp32["data_parallel_seconds"])
    assert amp["compute_seconds"] == pytest.approx(fp32["compute_seconds"] / 3)
    share = [b["data_parallel_exposed_seconds"] / b["data_parallel_seconds"] for b in (fp32, amp)]
    assert share[1] > 2 * share[0]
