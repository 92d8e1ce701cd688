"""The same training on CUDA (NCCL): runs only where a GPU is present, skips cleanly elsewhere.

Pre-flight refuses ``--device cuda`` for every combination not in
``disttrain.launch.gpu_support.PROVEN`` (empty until one of these tests has passed on
a GPU machine): to prove the one these tests run (allreduce, native, no compression,
fp32), add it there on that machine, run them, and record the run in docs/gpu.md.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from disttrain.launch import gpu_support
from tests.test_cli import run_cli

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _params(out: Path, device: str, workers: int, *extra: str) -> dict[str, torch.Tensor]:
    result = run_cli(
        "train",
        "--device",
        device,
        "--workers",
        str(workers),
        "--max-steps",
        "10",
        "--no-progress",
        "--out",
        str(out),
        *extra,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return torch.load(out / "model.pt", weights_only=True, map_location="cpu")  # type: ignore[no-any-return]


def _record(combo: gpu_support.Combination, request: pytest.FixtureRequest, how: str) -> None:
    """A passed proof: one JSON line in $DISTTRAIN_GPU_PROOF_LOG (make gpu-proof prints rows)."""
    log = os.environ.get("DISTTRAIN_GPU_PROOF_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(
                json.dumps({"combination": str(combo), "test": request.node.nodeid, "how": how})
                + "\n"
            )


def _worst(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two runs' parameters."""
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _assert_refused(out: Path, *flags: str) -> None:
    """A combination not in PROVEN is refused on a real GPU too, before any worker."""
    refused = run_cli(
        "train",
        "--device",
        "cuda",
        "--max-steps",
        "1",
        "--no-progress",
        "--out",
        str(out / "r"),
        *flags,
    )
    assert refused.returncode == 2 and "has not been proven" in refused.stderr, refused.stderr


def test_cuda_training_matches_cpu_training(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    cpu = _params(tmp_path / "cpu", "cpu", 1)
    gpu = _params(tmp_path / "gpu", "cuda", 1)
    worst = _worst(cpu, gpu)
    assert worst <= 1e-3, worst  # cuBLAS sums in another order than the CPU; 10 steps stay close
    _record(_combo("allreduce"), request, f"10 steps, CUDA vs CPU {worst:.1e} (<= 1e-3)")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL data parallelism needs 2 GPUs")
def test_two_gpu_workers_match_one(tmp_path: Path) -> None:
    one = _params(tmp_path / "one", "cuda", 1)
    two = _params(tmp_path / "two", "cuda", 2)
    worst = _worst(one, two)
    assert worst <= 1e-4, worst


@pytest.mark.parametrize(("precision", "tolerance"), [("bf16", 3e-2), ("fp16", 3e-3)])
def test_mixed_precision_on_one_gpu_trains_as_fp32_does(
    tmp_path: Path, precision: str, tolerance: float, request: pytest.FixtureRequest
) -> None:
    # autocast (and fp16's loss scaling) on CUDA against the fp32 CUDA run: 10 steps of the
    # default model differ by the low-precision matmuls' rounding only (bf16 keeps 8 bits
    # of mantissa, fp16 11: the tolerances are ~4 and ~0.5 of their ulps at weight scale)
    fp32 = _params(tmp_path / "fp32", "cuda", 1)
    low = _params(tmp_path / precision, "cuda", 1, "--precision", precision)
    worst = _worst(fp32, low)
    assert 0 < worst <= tolerance, worst  # 0: the precision was not applied at all
    _record(
        _combo("allreduce", precision),
        request,
        f"10 steps, {worst:.1e} from the fp32 CUDA run (<= {tolerance:g}, > 0)",
    )


def _combo(
    strategy: str, precision: str = "fp32", compile: str = "none"
) -> gpu_support.Combination:
    return gpu_support.Combination(strategy, "native", "none", precision, False, compile=compile)


@pytest.mark.parametrize(("precision", "tolerance"), [("fp32", 1e-3), ("bf16", 3e-2)])
def test_compiled_on_one_gpu_trains_as_eager_does(
    tmp_path: Path, precision: str, tolerance: float, request: pytest.FixtureRequest
) -> None:
    # inductor's Triton kernels fuse and reorder sums: 10 steps stay within the tolerances
    # of the CPU/GPU and mixed-precision comparisons above; > 0: it compiled something
    eager = _params(tmp_path / "eager", "cuda", 1, "--precision", precision)
    flags = ("--precision", precision, "--compile", "inductor")
    compiled = _params(tmp_path / "inductor", "cuda", 1, *flags)
    summary = json.loads((tmp_path / "inductor" / "summary.json").read_text())
    assert summary["compiled_graphs"] >= 1, summary
    worst = _worst(eager, compiled)
    assert worst <= tolerance, worst
    _record(
        _combo("allreduce", precision, "inductor"),
        request,
        f"10 steps, {worst:.1e} from the eager CUDA run (<= {tolerance:g}); "
        f"{summary['compiled_graphs']} graph(s) compiled",
    )


#: One-GPU runs beyond the native allreduce, each with the combination it proves: the
#: strategies whose own code runs on one rank (zero's shards and buffers, localsgd's and
#: diloco's local steps, diloco's outer step). Not here: the ring and tree algorithms,
#: --check-collectives and the codecs, which send nothing on one rank (nothing of theirs
#: would run: a one-GPU run proves nothing about them). A strategy's every stage must pass
#: (the combination has no stage). A run not in PROVEN must be refused (exit 2) on a GPU
#: machine too; to prove one, add it to PROVEN there and run this.
ONE_GPU_RUNS: list[tuple[tuple[str, ...], gpu_support.Combination]] = [
    (("--strategy", "zero", "--zero-stage", "1"), _combo("zero")),
    (("--strategy", "zero", "--zero-stage", "2"), _combo("zero")),
    (("--strategy", "zero", "--zero-stage", "3"), _combo("zero")),
    # a period of 5: two syncs in the 10 steps; sgd, as Adam's first steps (±lr whatever
    # the gradient's size) turn cuBLAS's last-bit differences into 1e-2 after 10 steps
    (("--strategy", "localsgd", "--period", "5"), _combo("localsgd")),
    (
        ("--strategy", "diloco", "--period", "5", "--optimizer", "sgd", "--lr", "0.1"),
        _combo("diloco"),
    ),
]


@pytest.mark.parametrize(
    ("flags", "combo"), ONE_GPU_RUNS, ids=[" ".join(f) for f, _ in ONE_GPU_RUNS]
)
def test_one_gpu_run_matches_cpu_or_is_refused(
    tmp_path: Path,
    flags: tuple[str, ...],
    combo: gpu_support.Combination,
    request: pytest.FixtureRequest,
) -> None:
    if combo not in gpu_support.PROVEN:
        _assert_refused(tmp_path, *flags)
        return
    cpu = _params(tmp_path / "cpu", "cpu", 1, *flags)
    gpu = _params(tmp_path / "gpu", "cuda", 1, *flags)
    worst = _worst(cpu, gpu)
    assert worst <= 1e-3, worst  # as the native fp32 run: cuBLAS's summation order only
    _record(combo, request, f"10 steps, CUDA vs CPU {worst:.1e} (<= 1e-3)")


#: The same strategies in bf16 and fp16 (autocast; fp16 with loss scaling), each against
#: its own fp32 CUDA run, with the tolerances of the native allreduce's mixed-precision test.
MIXED_RUNS = [
    (flags, precision, tolerance, _combo(combo.strategy, precision))
    for flags, combo in ONE_GPU_RUNS
    for precision, tolerance in (("bf16", 3e-2), ("fp16", 3e-3))
]


@pytest.mark.parametrize(
    ("flags", "precision", "tolerance", "combo"),
    MIXED_RUNS,
    ids=[f"{p} {' '.join(f)}" for f, p, _, _ in MIXED_RUNS],
)
def test_one_gpu_mixed_precision_run_is_close_to_fp32_or_is_refused(
    tmp_path: Path,
    flags: tuple[str, ...],
    precision: str,
    tolerance: float,
    combo: gpu_support.Combination,
    request: pytest.FixtureRequest,
) -> None:
    low_flags = (*flags, "--precision", precision)
    if combo not in gpu_support.PROVEN:
        _assert_refused(tmp_path, *low_flags)
        return
    fp32 = _params(tmp_path / "fp32", "cuda", 1, *flags)
    low = _params(tmp_path / precision, "cuda", 1, *low_flags)
    worst = _worst(fp32, low)
    assert 0 < worst <= tolerance, worst  # 0: the precision was not applied at all
    _record(combo, request, f"10 steps, {worst:.1e} from the fp32 CUDA run (<= {tolerance:g}, > 0)")


# --- Several ranks on one GPU (``--backend gloo``) --------------------------------------
#
# NCCL refuses two ranks on one device, and the GPU machines lent to this project have one
# GPU. With ``--backend gloo`` the ranks keep CUDA tensors (models, gradients, buffers) and
# talk over gloo: collectives on CUDA tensors where gloo has them, point-to-point messages
# and the codecs staged through host memory (comm/p2p.py, compression/exchange.py). Each run
# is compared with the same flags on the CPU (fp32) or with its own fp32 run (bf16, fp16).


def _gloo_combo(flags: tuple[str, ...], precision: str = "fp32") -> gpu_support.Combination:
    def value(name: str, default: str) -> str:
        return flags[flags.index(name) + 1] if name in flags else default

    return gpu_support.Combination(
        value("--strategy", "allreduce"),
        # auto's table on cuda is the backend's own (launch.autotable.OWN_TABLE)
        value("--algorithm", "native").replace("auto", "native"),
        value("--compression", "none").split(":", 1)[0],
        precision,
        "--check-collectives" in flags,
        several=True,
        backend="gloo",
    )


#: The extra flags each strategy needs at ``workers`` ranks (2 unless it needs more).
_STRATEGY_FLAGS: dict[str, tuple[str, ...]] = {
    "ps": ("--ps-mode", "sync"),  # async's order of arrivals differs from run to run
    "hybrid": ("--workers", "4", "--tp", "2"),
    "diloco": ("--period", "5", "--optimizer", "sgd", "--lr", "0.1"),
    "localsgd": ("--period", "5"),
}

#: The codecs' parameters (a ratio, a threshold, a rank): one value each.
_CODEC_VALUES = {"topk": "topk:0.1", "onebit": "onebit:0.03", "powersgd": "powersgd:2"}


def _strategy_runs() -> list[tuple[str, ...]]:
    from disttrain import strategies

    return [("--strategy", s, *_STRATEGY_FLAGS.get(s, ())) for s in strategies.STRATEGIES.names()]


def _algorithm_runs() -> list[tuple[str, ...]]:
    from disttrain import collectives

    return [
        ("--workers", "4", "--algorithm", a)
        for a in collectives.ALGORITHMS.names()
        if a not in ("native", "auto")
    ]  # fmt: skip  (native, and auto, native on cuda: the strategies' runs)


def _codec_runs() -> list[tuple[str, ...]]:
    from disttrain.compression import registry

    names = [n for n in registry.COMPRESSORS.names() if n != "none"]
    return [("--compression", _CODEC_VALUES.get(n, n)) for n in names] + [
        ("--check-collectives",),
        ("--strategy", "decentralized", "--compression", "topk:0.1"),
    ]


GLOO_RUNS = _strategy_runs() + _algorithm_runs() + _codec_runs()


def _workers(flags: tuple[str, ...]) -> tuple[int, tuple[str, ...]]:
    if "--workers" in flags:
        i = flags.index("--workers")
        return int(flags[i + 1]), flags[:i] + flags[i + 2 :]
    return 2, flags


@pytest.mark.parametrize("flags", GLOO_RUNS, ids=[" ".join(f) for f in GLOO_RUNS])
def test_ranks_sharing_one_gpu_match_cpu_ranks(
    tmp_path: Path, flags: tuple[str, ...], request: pytest.FixtureRequest
) -> None:
    combo = _gloo_combo(flags)
    workers, rest = _workers(flags)
    if combo not in gpu_support.PROVEN and os.environ.get(gpu_support.PROVING_ENV) != "1":
        _assert_refused(tmp_path, "--backend", "gloo", "--workers", str(workers), *rest)
        return
    cpu = _params(tmp_path / "cpu", "cpu", workers, *rest)
    gpu = _params(tmp_path / "gpu", "cuda", workers, "--backend", "gloo", *rest)
    worst = _worst(cpu, gpu)
    # cuBLAS's summation order, as the one-GPU runs; top-k's choice is discontinuous: a
    # near-tie in |g| sent on one device and kept on the other moves that entry by lr·|g|
    tolerance = 1e-2 if combo.compression == "topk" else 1e-3
    assert worst <= tolerance, worst
    _record(
        combo,
        request,
        f"{workers} ranks on one GPU over gloo, 10 steps, CUDA vs CPU "
        f"{worst:.1e} (<= {tolerance:g})",
    )


GLOO_MIXED = [(f, p, t) for f in _strategy_runs() for p, t in (("bf16", 3e-2), ("fp16", 3e-3))]


@pytest.mark.parametrize(
    ("flags", "precision", "tolerance"),
    GLOO_MIXED,
    ids=[f"{p} {' '.join(f)}" for f, p, _ in GLOO_MIXED],
)
def test_ranks_sharing_one_gpu_in_mixed_precision_stay_near_fp32(
    tmp_path: Path,
    flags: tuple[str, ...],
    precision: str,
    tolerance: float,
    request: pytest.FixtureRequest,
) -> None:
    combo = _gloo_combo(flags, precision)
    workers, rest = _workers(flags)
    gloo = ("--backend", "gloo", *rest)
    if combo not in gpu_support.PROVEN and os.environ.get(gpu_support.PROVING_ENV) != "1":
        _assert_refused(tmp_path, "--workers", str(workers), *gloo, "--precision", precision)
        return
    fp32 = _params(tmp_path / "fp32", "cuda", workers, *gloo)
    low = _params(tmp_path / precision, "cuda", workers, *gloo, "--precision", precision)
    worst = _worst(fp32, low)
    assert 0 < worst <= tolerance, worst  # 0: the precision was not applied at all
    _record(
        combo,
        request,
        f"{workers} ranks on one GPU over gloo, 10 steps, {worst:.1e} from "
        f"the fp32 run (<= {tolerance:g}, > 0)",
    )
