"""PowerSGD: exact at full rank, error feedback loses nothing, the meter sees the stated bytes,
and it agrees with torch's own ``powerSGD_hook`` on the same gradients (same Q seed)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from disttrain.comm.errors import UsageError
from disttrain.compression.powersgd import PowerSGD, orthogonalize
from disttrain.compression.registry import parse
from tests.harness import run_world

SHAPES = [torch.Size(s) for s in ((16, 20), (9,), (8, 3, 5), (12, 2), (3,))]
NUMEL = sum(s.numel() for s in SHAPES)


def test_full_rank_reconstructs_exactly() -> None:
    # rank >= min(n, m): span(M Q) is M's column space, so P P^T M = M (up to rounding)
    c = PowerSGD(16, min_compression_rate=0)  # 0: every tensor goes through P and Q
    c.bind_shapes(SHAPES)
    x = torch.randn(NUMEL)
    for _ in range(3):  # first step (random Q) and warm-started ones
        payload, decoded = c.compress_and_decode(x)
        assert torch.allclose(decoded, x, atol=1e-5), float((decoded - x).abs().max())
        assert torch.allclose(c.decompress(payload), x, atol=1e-5)
    assert c.figures()["powersgd_matrices"] == len(SHAPES)


def test_low_rank_is_lossy_and_small_tensors_stay_dense() -> None:
    c = PowerSGD(1)
    c.bind_shapes([torch.Size((64, 32)), torch.Size((32,))])
    x = torch.randn(64 * 32 + 32)
    payload, decoded = c.compress_and_decode(x)
    assert payload.data.numel() == 32 + 64 + 32  # the vector whole, P (64x1), Q (32x1)
    assert torch.equal(decoded[-32:], x[-32:])  # the vector exactly
    assert not torch.allclose(decoded[:-32], x[:-32], atol=1e-3)  # a rank-1 matrix is lossy


def test_orthogonalize_matches_qr_columns() -> None:
    m = torch.randn(10, 2)
    q = torch.linalg.qr(m).Q
    orthogonalize(m)
    assert torch.allclose(m.abs(), q.abs(), atol=1e-6)  # equal up to the sign of each column
    zero = torch.zeros(5, 2)
    orthogonalize(zero)
    assert torch.equal(zero, torch.zeros(5, 2))  # no NaN from an all-zero gradient


def test_spec_parsing() -> None:
    assert parse("powersgd:4").spec == "powersgd:4"
    with pytest.raises(UsageError):
        parse("powersgd:1.5")
    with pytest.raises(UsageError):
        parse("powersgd:0")


def _feedback_and_bytes(algorithm: str) -> dict[str, float]:
    import torch.distributed as dist

    from disttrain.collectives.checks import check_cost_bytes
    from disttrain.compression.error_feedback import ErrorFeedback
    from disttrain.compression.exchange import (
        CompressionStats,
        compressed_all_reduce,
        dense_allreduce_bytes,
    )

    rank, size = dist.get_rank(), dist.get_world_size()
    c = PowerSGD(2, start_step=1)
    c.bind_shapes(SHAPES)
    feedback, stats = ErrorFeedback(c), CompressionStats()
    gen = torch.Generator().manual_seed(10 + rank)
    inputs = torch.zeros(NUMEL, dtype=torch.float64)
    sums = torch.zeros(NUMEL, dtype=torch.float64)
    stated, seen = 0, set()
    for _ in range(4):
        x = torch.randn(NUMEL, generator=gen)
        inputs += x.double()
        rounds = tuple(c.round_numels(NUMEL))
        for k in rounds:  # each round: its allreduce, and the length check until agreed once
            check = check_cost_bytes(size)[0] if rounds not in seen else 0
            stated += dense_allreduce_bytes(k, size, rank, algorithm) + check
        seen.add(rounds)
        flat = x.clone()
        compressed_all_reduce(flat, c, algorithm, None, feedback, stats)
        sums += flat.double()
    assert feedback.residual is not None
    residual = feedback.residual.double().clone()
    dist.all_reduce(residual)
    dist.all_reduce(inputs)
    return {
        # every rank's inputs = what the sums delivered (the same on each rank) + all residuals
        "mass_error": float((sums + residual - inputs).abs().max()),
        "residual": float(residual.abs().max()),
        "metered": stats.sent_bytes,
        "stated": stated,
        "ratio": stats.payload_compression,
    }


@pytest.mark.parametrize("algorithm", ["native", "ring"])
def test_error_feedback_conserves_mass_and_meter_sees_stated_bytes(algorithm: str) -> None:
    for out in run_world(_feedback_and_bytes, 2, args=(algorithm,), timeout=120):
        assert out["mass_error"] < 1e-4, out  # float32 sums of ~N(0,1) entries over 4 steps
        assert out["metered"] == out["stated"], out
        assert out["ratio"] > 1.0, out


def _rounds_of_other_lengths() -> str:
    import torch.distributed as dist

    from disttrain.comm import CollectiveMismatch
    from disttrain.compression.exchange import compressed_all_reduce

    c = PowerSGD(2)
    # the same entries, other layers on rank 1: other P and Q lengths
    c.bind_shapes(SHAPES if dist.get_rank() == 0 else [torch.Size([NUMEL])])
    try:
        compressed_all_reduce(torch.randn(NUMEL), c, "ring")
    except CollectiveMismatch as exc:
        return str(exc)
    return "no error"


def test_ranks_whose_rounds_differ_get_the_length_check_on_the_first_call() -> None:
    # the rounds are checked until every rank has agreed on them once (then unchecked)
    for message in run_world(_rounds_of_other_lengths, 2, timeout=120):
        assert "different lengths" in message, message


def _against_torch_hook() -> float:
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ref
    from torch.nn import functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from disttrain.dataparallel.ddp_hooks import CompressorHook, compressed_hook

    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    base = torch.nn.Sequential(
        torch.nn.Linear(32, 48),
        torch.nn.ReLU(),
        torch.nn.Linear(48, 40),
        torch.nn.ReLU(),
        torch.nn.Linear(40, 5),
    )
    theirs, mine = DDP(copy.deepcopy(base)), DDP(copy.deepcopy(base))
    state = ref.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2)
    theirs.register_comm_hook(state, ref.powerSGD_hook)
    mine.register_comm_hook(CompressorHook(lambda: PowerSGD(2, start_step=2)), compressed_hook)
    gen = torch.Generator().manual_seed(3 + rank)
    worst = 0.0
    for _ in range(6):  # 2 dense steps, then compressed: first Q random, then warm-started
        x, y = torch.randn(8, 32, generator=gen), torch.randint(0, 5, (8,), generator=gen)
        grads = []
        for model in (theirs, mine):
            model.zero_grad()
            F.cross_entropy(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        worst = max(worst, *(float((a - b).abs().max()) for a, b in zip(*grads, strict=True)))
    return worst


def test_agrees_with_torch_powersgd_hook() -> None:
    # Same gradients, same seed for Q (numpy RandomState(0) -> torch.manual_seed), same
    # arithmetic order: float32 rounding apart (Gram-Schmidt on P, matmuls), equal to 1e-5.
    for worst in run_world(_against_torch_hook, 2, timeout=120):
        assert worst < 1e-5, worst


@pytest.mark.timeout(300)
def test_predicted_bytes_are_the_metered_bytes_of_a_run(tmp_path: Any) -> None:
    # The cost model's bytes (the compressor's own rounds, each a ring allreduce of fp32
    # sums) against the meter of a real 2-worker run of the same model: equal, per step.
    from disttrain.lab import costmodel
    from disttrain.lab.calibration import Calibration
    from tests.strategies.test_localsgd import run as run_local
    from tests.strategies.test_localsgd import tiny_mlp

    steps, spec = 4, "allreduce:ring:compression=powersgd:2"
    summary, _ = run_local(
        str(tmp_path),
        "psgd",
        strategy="allreduce",
        algorithm="ring",
        compression="powersgd:2",
        max_steps=steps,
    )
    model = tiny_mlp()
    shapes = tuple(tuple(p.shape) for p in model.parameters())
    work = costmodel.Workload(
        params=sum(p.numel() for p in model.parameters()), batch_size=32, shapes=shapes
    )
    net = costmodel.Network(alpha=5e-6, beta=8 / 10e9)
    pred = costmodel.predict(spec, work, 2, net, Calibration.defaults())
    assert summary["steps"] == steps
    metered = summary["bytes_sent_per_rank"]  # the mean over ranks (both send the same)
    assert metered == steps * pred.bytes_per_rank, (metered, pred.bytes_per_rank)
    # and it is what PowerSGD says it sends: (vectors, P, Q) instead of every entry
    dense = costmodel.predict("allreduce:ring", work, 2, net, Calibration.defaults())
    assert pred.bytes_per_rank < dense.bytes_per_rank
    assert pred.comm_seconds > 0 and "powersgd:2" in pred.reason


def test_cost_model_refuses_what_it_cannot_know() -> None:
    from disttrain.lab import costmodel
    from disttrain.lab.calibration import Calibration

    net, cal = costmodel.Network(alpha=5e-6, beta=8 / 10e9), Calibration.defaults()
    work = costmodel.Workload(params=10_000, batch_size=32)  # no shapes: P, Q unknown
    with pytest.raises(ValueError, match="layer shapes"):
        costmodel.predict("allreduce:ring:compression=powersgd:2", work, 4, net, cal)
    with pytest.raises(costmodel.NotModelled, match="decentralized:topk"):
        costmodel.predict("allreduce:ring:compression=topk:0.01", work, 4, net, cal)
    # a cast: the same buckets in 16 bits, half the bytes
    half = costmodel.predict("allreduce:ring:compression=fp16", work, 4, net, cal)
    full = costmodel.predict("allreduce:ring", work, 4, net, cal)
    assert 2 * half.bytes_per_rank == full.bytes_per_rank


def test_codec_flops_count_the_three_matmuls_and_stop_during_the_warm_up() -> None:
    c = PowerSGD(2, start_step=1)
    c.bind_shapes([torch.Size([32, 64]), torch.Size([32])])
    assert c.codec_flops(32 * 64 + 32) == 0.0  # dense warm-up step: no codec
    c.calls = 1
    assert c.codec_flops(32 * 64 + 32) == 6 * 32 * 64 * 2 + 4 * (32 + 64) * 4
