"""Adasum (collectives/adasum.py) on 1, 2 and 4 ranks against the recursive pairwise
definition computed in one process (float64):

    Adasum(a, b) = (1 - a·b / (2‖a‖²)) a + (1 - a·b / (2‖b‖²)) b,
    Adasum(v_0..v_{n-1}) = Adasum(Adasum(v_0..v_{n/2-1}), Adasum(v_{n/2}..v_{n-1})),

a coefficient being 1 where its squared norm is below sqrt(DBL_MIN) (Horovod's rule).
Tolerance: max |got - expected| <= tol · max |expected|, tol 1e-6 for float32, 1e-12 for
float64, 5e-3 for float16 (each VHDD level rounds the kept half to the tensor's dtype);
every rank's result must be bitwise the same. Cases: random correlated vectors of
different magnitudes, one rank's vector zero, all zero, lengths 0, 1, 2 (fewer elements
than ranks), odd lengths that do not halve evenly; and the paper's properties: equal
vectors give that vector, parallel ones their average, orthogonal ones their sum.
"""

from __future__ import annotations

import math
import sys
import zlib
from typing import Any

import pytest
import torch

from tests.harness import run_world

TOL = {torch.float32: 1e-6, torch.float64: 1e-12, torch.float16: 5e-3}
LENGTHS = (0, 1, 2, 7, 1001)


def pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The paper's operator on two float64 tensors (as flat vectors), with Horovod's
    zero-norm rule."""
    tiny = math.sqrt(sys.float_info.min)
    dot, a_sq, b_sq = float((a * b).sum()), float((a * a).sum()), float((b * b).sum())
    c_a = 1 - dot / (2 * a_sq) if a_sq >= tiny else 1.0
    c_b = 1 - dot / (2 * b_sq) if b_sq >= tiny else 1.0
    return c_a * a + c_b * b


def reference(vectors: list[torch.Tensor]) -> torch.Tensor:
    """The binary tree over ranks: first half, second half, combined pairwise."""
    if len(vectors) == 1:
        return vectors[0].double()
    half = len(vectors) // 2
    return pair(reference(vectors[:half]), reference(vectors[half:]))


def _inputs(kind: str, n: int, length: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Every rank's vector for a case (each rank builds them all, from the same seed)."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{kind} {n} {length}".encode()))
    common = torch.randn(length, generator=gen, dtype=torch.float64)
    if kind == "random":  # correlated, of different sizes: coefficients far from 1
        out = [
            (common + torch.randn(length, generator=gen, dtype=torch.float64)) * 2.0**r
            for r in range(n)
        ]
    elif kind == "one_zero":
        out = [
            common * (r + 1) + torch.randn(length, generator=gen, dtype=torch.float64)
            for r in range(n)
        ]
        out[min(1, n - 1)] = torch.zeros(length, dtype=torch.float64)
    elif kind == "all_zero":
        out = [torch.zeros(length, dtype=torch.float64) for _ in range(n)]
    elif kind == "equal":
        out = [common] * n
    elif kind == "parallel":  # 2^(r-1) · v (exactly parallel once rounded): the average
        out = [common * 2.0 ** (r - 1) for r in range(n)]
    else:  # orthogonal: columns of an orthonormal basis, scaled: their sum
        q, _ = torch.linalg.qr(torch.randn(length, n, generator=gen, dtype=torch.float64))
        out = [q[:, r] * (r + 1) for r in range(n)]
    return [v.to(dtype) for v in out]


def _cases(n: int) -> list[tuple[str, int, torch.dtype]]:
    cases = [("random", length, dtype) for length in LENGTHS for dtype in TOL]
    cases += [
        (kind, length, torch.float32)
        for kind in ("one_zero", "equal", "parallel")
        for length in (1, 7, 1001)
    ]
    cases += [("all_zero", 7, torch.float64), ("one_zero", 1001, torch.float64)]
    return cases + [("orthogonal", length, torch.float64) for length in (n + 3, 1001)]


def _body() -> dict[str, Any]:
    import torch.distributed as dist

    from disttrain.collectives.adasum import adasum_
    from disttrain.comm import forming, world

    me, n = dist.get_rank(), dist.get_world_size()
    got: dict[str, Any] = {}
    for kind, length, dtype in _cases(n):
        mine = _inputs(kind, n, length, dtype)[me].clone()
        assert adasum_(mine) is mine
        got[f"{kind} {length} {dtype}"] = mine
    for dtype in (torch.bfloat16, torch.int64):  # refused here, before any message
        try:
            adasum_(torch.ones(3, dtype=dtype))
        except ValueError:
            got[f"refused {dtype}"] = True
    if n == 4:  # a group of two (global ranks 1, 3), and one of three, refused on each member
        pair_group = forming.new_group([1, 3], timeout=world.group_timeout())
        three = forming.new_group([0, 1, 2], timeout=world.group_timeout())
        if me in (1, 3):
            x = _inputs("random", 2, 7, torch.float64)[me // 2].clone()
            got["subgroup"] = adasum_(x, pair_group)
        if me < 3:
            try:
                adasum_(torch.ones(4), three)
            except ValueError as exc:
                got["three"] = str(exc)
    return got


@pytest.mark.parametrize("n", [1, 2, 4])
def test_adasum_equals_the_recursive_pairwise_definition(n: int) -> None:
    results = run_world(_body, n, timeout=120)
    for kind, length, dtype in _cases(n):
        key = f"{kind} {length} {dtype}"
        inputs = _inputs(kind, n, length, dtype)
        expected = reference(inputs)
        if kind == "equal":
            expected = inputs[0].double()  # Adasum(a, a) = a
        elif kind == "parallel":
            expected = sum(v.double() for v in inputs) / n
        elif kind == "orthogonal":
            expected = sum(v.double() for v in inputs)
        for r in range(n):
            got = results[r][key]
            assert got.dtype == dtype and got.shape == (length,), key
            assert torch.equal(got, results[0][key]), f"{key}: rank {r} differs from rank 0"
            err = float((got.double() - expected).abs().max()) if length else 0.0
            scale = float(expected.abs().max()) if length else 0.0
            assert err <= TOL[dtype] * scale, f"{key}: error {err:.3g}, scale {scale:.3g}"
    for by_rank in results:
        assert by_rank["refused torch.bfloat16"] and by_rank["refused torch.int64"]
    if n == 4:
        expected = reference(_inputs("random", 2, 7, torch.float64))
        for r in (1, 3):
            torch.testing.assert_close(results[r]["subgroup"], expected, rtol=1e-12, atol=0)
        for r in (0, 1, 2):
            assert "power-of-two" in results[r]["three"]


def test_the_reference_is_the_papers_formula() -> None:
    """By hand: a = (1, 0), b = (1, 1): a·b = 1, ‖a‖² = 1, ‖b‖² = 2, so
    (1 - 1/2) a + (1 - 1/4) b = (1.25, 0.75); a zero vector gives the other one."""
    a, b = torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([1.0, 1.0]).double()
    assert pair(a, b).tolist() == [1.25, 0.75]
    assert pair(torch.zeros(2, dtype=torch.float64), b).tolist() == b.tolist()
    assert reference([a, a, a, a]).tolist() == a.tolist()
