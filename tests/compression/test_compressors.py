"""Compress/decompress round-trips and each compressor's stated wire size."""

from __future__ import annotations

import math

import pytest
import torch

from disttrain.comm.errors import UsageError
from disttrain.compression import OneBit, SparseCompressor, TopK, parse
from disttrain.compression.base import Payload, add_decoded


def _x(n: int = 5000, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("spec,tol", [("none", 0.0), ("fp16", 2**-11), ("bf16", 2**-8)])
def test_casts_round_trip_within_their_precision(spec: str, tol: float) -> None:
    c = parse(spec)
    x = _x()
    p = c.compress(x)
    y = c.decompress(p)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert torch.all((y - x).abs() <= tol * x.abs())
    assert c.wire_bytes(p) == p.nbytes == {"none": 4, "fp16": 2, "bf16": 2}[spec] * x.numel()


def test_topk_keeps_exactly_the_largest_entries() -> None:
    x = _x()
    c = TopK(0.01)
    y = c.decompress(c.compress(x))
    k = math.ceil(0.01 * x.numel())
    kept = torch.nonzero(y).reshape(-1)
    assert kept.numel() == k
    assert torch.equal(y[kept], x[kept])  # fp32 values sent bit-exactly
    assert x.abs()[kept].min() >= x.abs()[y == 0].max()


def test_onebit_sends_sign_times_tau_beyond_the_threshold() -> None:
    x = _x()
    tau = 1.5
    y = OneBit(tau).decompress(OneBit(tau).compress(x))
    expected = torch.where(x.abs() > tau, torch.sign(x) * tau, torch.zeros_like(x))
    assert torch.equal(y, expected)


@pytest.mark.parametrize("spec", ["topk:0.001", "topk:1", "onebit:0.5", "onebit:100"])
def test_sparse_stated_size_is_the_payload_size(spec: str) -> None:
    c = parse(spec)
    for seed in range(3):
        p = c.compress(_x(seed=seed))
        assert c.wire_bytes(p) == p.nbytes
        assert torch.equal(c.decompress(Payload(p.data.clone(), p.numel)), c.decompress(p))


@pytest.mark.parametrize("spec", ["none", "fp16", "bf16", "topk:0.01", "onebit:0.7"])
def test_compress_and_decode_agrees_with_decompress(spec: str) -> None:
    # error feedback uses the shortcut; receivers use decompress: they must agree bit for bit
    c = parse(spec)
    p, dense = c.compress_and_decode(_x(seed=7))
    assert torch.equal(dense, c.decompress(p))
    assert torch.equal(p.data, c.compress(_x(seed=7)).data)


@pytest.mark.parametrize(
    "spec", ["none", "fp16", "topk:0.01", "topk:1", "onebit:0.7", "onebit:100"]
)
def test_add_into_is_the_dense_add_bit_for_bit(spec: str) -> None:
    # the decentralized sum adds sparse payloads entry by entry: replicas must not drift
    c = parse(spec)
    p = c.compress(_x(seed=3))
    running = _x(seed=4) * 1e-3
    expected = running + c.decompress(p)
    add_decoded(c, running, p)
    assert torch.equal(running, expected)


@pytest.mark.parametrize("spec", ["topk:0.01", "onebit:0.7", "onebit:100"])
def test_sparse_entries_are_the_sent_positions(spec: str) -> None:
    c = parse(spec)
    assert isinstance(c, SparseCompressor)
    p, dense = c.compress_and_decode(_x(seed=5))
    idx, values = c.entries(p)
    assert idx.tolist() == torch.nonzero(dense).reshape(-1).tolist()
    assert torch.equal(torch.from_numpy(values), dense[torch.from_numpy(idx)])


def test_onebit_costs_a_few_bits_per_entry() -> None:
    x = _x(100_000)
    p = OneBit(3.0).compress(x)  # ~0.27% of entries beyond 3 sigma
    sent = int((x.abs() > 3.0).sum())
    bits = 8 * p.nbytes / sent
    assert bits < 13  # ~9.5 bits of gap code + 1 sign bit + header
    assert 4 * x.numel() / p.nbytes > 250


BAD = ["fp8", "topk", "topk:0", "topk:2", "onebit:-1", "onebit:x", "fp16:3"]


@pytest.mark.parametrize("bad", BAD)
def test_bad_specs_are_usage_errors(bad: str) -> None:
    with pytest.raises(UsageError, match="--compression"):
        parse(bad)
