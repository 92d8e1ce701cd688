"""``disttrain advise --scenario FILE.toml [--json OUT.json]``: one scenario's prediction.

Prints the prediction and its parts; ``--json`` writes
``{"samples_per_second", "scaling_efficiency", "step_seconds", "breakdown"}``.
"""

from __future__ import annotations

import json

from disttrain.comm.errors import UsageError
from disttrain.lab.scenario.reader import load
from disttrain.lab.scenario.steptime import describe, predict

__all__ = ["run"]


def _figure(x: float) -> str:
    return f"{x:,.1f}" if x >= 100 else f"{x:.4g}"


def _gpus(n: int) -> str:
    return "1 GPU" if n == 1 else f"{n} GPUs"


def run(path: str, json_path: str = "") -> int:
    sc = load(path)
    p = predict(sc)
    b = p.breakdown
    r = sc.run
    print(f"{path}: {describe(sc.model)}")
    if sc.measured is not None:
        m = sc.measured
        print(
            f"one-GPU rate {_figure(b['gpu_samples_per_second'])} samples/s, backed out of the "
            f"measured run: {_gpus(m.run.gpus)}, {m.run.strategy}, batch {m.run.batch_per_gpu} "
            f"x {m.run.accumulation} x {m.run.dp} = {m.run.global_batch}, "
            f"{_figure(m.samples_per_second)} samples/s"
        )
    print(
        f"{r.gpus} GPUs ({sc.hardware.gpus_per_node} per node), strategy {r.strategy}, "
        f"batch {r.batch_per_gpu} x {r.accumulation} micro-batches x {r.dp} replicas = "
        f"{r.global_batch}, {r.precision}, {r.library}"
    )
    print(
        f"samples/s {p.samples_per_second:,.1f}   step {p.step_seconds * 1e3:,.1f} ms   "
        f"scaling efficiency {p.scaling_efficiency:.1%}   "
        f"model TFLOP/s per GPU {b['model_tflops_per_gpu']:.1f}"
    )
    parts = (
        ("compute", "compute_seconds"),
        ("tensor-parallel allreduces", "tensor_parallel_seconds"),
        ("pipeline sends", "pipeline_p2p_seconds"),
        ("pipeline bubble", "pipeline_bubble_seconds"),
        ("data-parallel, exposed", "data_parallel_exposed_seconds"),
        ("synchronisation", "sync_seconds"),
    )
    for label, key in parts:
        print(f"  {label:<28} {b[key] * 1e3:12,.1f} ms")
    print(
        f"  (data-parallel communication in all {b['data_parallel_seconds'] * 1e3:,.1f} ms, "
        f"{b['allreduce_algorithm']})"
    )
    if json_path:
        try:
            with open(json_path, "w") as fh:
                json.dump(p.as_json(), fh, indent=1)
        except OSError as exc:
            raise UsageError(f"--json {json_path}: {exc.strerror or exc}") from None
    return 0
