"""The same training on CUDA (NCCL): runs only where a GPU is present, skips cleanly elsewhere.

Pre-flight refuses ``--device cuda`` for every combination not in
``disttrain.launch.gpu_support.PROVEN`` (empty until one of these tests has passed on
a GPU machine): to prove the one these tests run (allreduce, native, no compression,
fp32), add it there on that machine, run them, and record the run in docs/gpu.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.test_cli import run_cli

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _params(out: Path, device: str, workers: int, *extra: str) -> dict[str, torch.Tensor]:
    result = run_cli(
        "train", "--device", device, "--workers", str(workers), "--max-steps", "10",
        "--no-progress", "--out", str(out), *extra, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return torch.load(out / "model.pt", weights_only=True, map_location="cpu")  # type: ignore[no-any-return]


def test_cuda_training_matches_cpu_training(tmp_path: Path) -> None:
    cpu = _params(tmp_path / "cpu", "cpu", 1)
    gpu = _params(tmp_path / "gpu", "cuda", 1)
    worst = max(float((cpu[k] - gpu[k]).abs().max()) for k in cpu)
    assert worst <= 1e-3, worst  # cuBLAS sums in another order than the CPU; 10 steps stay close


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL data parallelism needs 2 GPUs")
def test_two_gpu_workers_match_one(tmp_path: Path) -> None:
    one = _params(tmp_path / "one", "cuda", 1)
    two = _params(tmp_path / "two", "cuda", 2)
    worst = max(float((one[k] - two[k]).abs().max()) for k in one)
    assert worst <= 1e-4, worst


@pytest.mark.parametrize(("precision", "tolerance"), [("bf16", 3e-2), ("fp16", 3e-3)])
def test_mixed_precision_on_one_gpu_trains_as_fp32_does(
    tmp_path: Path, precision: str, tolerance: float
) -> None:
    # autocast (and fp16's loss scaling) on CUDA against the fp32 CUDA run: 10 steps of the
    # default model differ by the low-precision matmuls' rounding only (bf16 keeps 8 bits
    # of mantissa, fp16 11: the tolerances are ~4 and ~0.5 of their ulps at weight scale)
    fp32 = _params(tmp_path / "fp32", "cuda", 1)
    low = _params(tmp_path / precision, "cuda", 1, "--precision", precision)
    worst = max(float((fp32[k] - low[k]).abs().max()) for k in fp32)
    assert 0 < worst <= tolerance, worst  # 0: the precision was not applied at all
