"""Entropy coding of sorted index sets: gaps coded with exponential-Golomb codes of order k.

Sparse payloads (top-k, one-bit threshold) send *which* entries changed. Strom
(2015) entropy-codes these indices; here the gaps ``g = i_t - i_{t-1} - 1``
(geometric-like for random positions, near 0 for clusters) are coded with the
order-k exponential-Golomb code: ``v = (g >> k) + 1`` written as
``L = floor(log2 v)`` in unary, then the ``L`` bits of ``v`` below its leading
one, then the ``k`` low bits of ``g``; cost ``2L + 1 + k`` bits. Unlike a
Golomb-Rice code, a single huge gap costs only ~2 log2(gap) bits, so mixtures
of clusters and long jumps stay cheap. ``k`` is chosen per payload to minimise
the total (tried 0..31, vectorised).

The three parts are stored as three consecutive bit streams (all unary
prefixes, all mantissas, all low bits) instead of interleaved per index: the
size is identical, and both directions become vectorised numpy (the decoder
finds the n-th zero of the unary stream instead of walking bit by bit).

Layout: ``count`` (uint32 little-endian), ``k`` (uint8), then the packed bits
(MSB first), padded to a byte. The code is self-delimiting: the decoder
returns how many bytes it read, so more data may follow.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "HEADER_BYTES",
    "best_order",
    "decode_indices",
    "empirical_entropy_bits",
    "encode_indices",
    "order_costs",
]

#: count (uint32) + k (uint8)
HEADER_BYTES = 5
_MAX_K = 31


def _gaps(indices: np.ndarray) -> np.ndarray:
    idx = np.asarray(indices, dtype=np.int64)
    if idx.size and (idx[0] < 0 or np.any(np.diff(idx) <= 0)):
        raise ValueError("indices must be sorted, unique and non-negative")
    return np.diff(idx, prepend=-1) - 1


def _bit_lengths(v: np.ndarray) -> np.ndarray:
    """floor(log2 v) for 1 <= v < 2^53: frexp's exponent is exact for such integers."""
    return (np.frexp(v.astype(np.float64))[1] - 1).astype(np.int64)


def _cost_bits(gaps: np.ndarray, k: int) -> int:
    return int(2 * _bit_lengths((gaps >> k) + 1).sum()) + gaps.size * (1 + k)


def order_costs(gaps: np.ndarray) -> np.ndarray:
    """The exact size in bits of the code of ``gaps`` at every order k = 0..31, in one pass.

    Per gap, ``2L + 1 + k`` bits with ``L = floor(log2((g >> k) + 1))``. Since
    ``(g >> k) + 1 == (g + 2^k) >> k``, ``L = bitlen(g + 2^k) - k - 1``, so the total is
    ``2·Σ bitlen(g + 2^k) - n(k + 1)``. With ``b = bitlen(g)``, ``bitlen(g + 2^k)`` is
    ``k + 1`` when ``b <= k``, ``k + 2`` when ``b == k + 1``, and ``b`` plus a carry when
    ``b >= k + 2``; the carry happens iff bits k..b-1 of g are all ones, i.e. iff
    ``k >= s`` where ``s = bitlen(g XOR (2^b - 1))`` (b minus g's leading ones). So a
    histogram of b and a difference array of the carry ranges [s, b-2] give every order.
    """
    orders = np.arange(_MAX_K + 1, dtype=np.int64)
    n = gaps.size
    if n == 0:
        return np.zeros(orders.size, dtype=np.int64)
    g = gaps.astype(np.int64)
    b = _bit_lengths_or_zero(g)
    s = _bit_lengths_or_zero(g ^ ((np.int64(1) << b) - 1))
    top = 66  # bit lengths of int64 gaps are < 64; k + 2 <= 33
    count_b = np.bincount(b, minlength=top)  # gaps of each bit length
    sum_b = np.bincount(b, weights=b.astype(np.float64), minlength=top)
    below = np.cumsum(count_b)  # below[j]: gaps with b <= j
    sum_above = sum_b[::-1].cumsum()[::-1]  # sum_above[j]: Σ b over gaps with b >= j
    carry_ranges = s <= b - 2
    diff = np.bincount(s[carry_ranges], minlength=top) - np.bincount(
        b[carry_ranges] - 1, minlength=top
    )
    carries = np.cumsum(diff)
    total = (
        below[orders] * (orders + 1)  # b <= k
        + count_b[orders + 1] * (orders + 2)  # b == k + 1
        + sum_above[orders + 2].astype(np.int64)  # b >= k + 2, before the carry
        + carries[orders]
    )
    return 2 * total - n * (orders + 1)


def _bit_lengths_or_zero(v: np.ndarray) -> np.ndarray:
    """bitlen(v) (0 for v == 0) for 0 <= v < 2^53, exactly, from frexp's exponent."""
    return np.frexp(v.astype(np.float64))[1].astype(np.int64)


def best_order(gaps: np.ndarray) -> int:
    """The order k in 0..31 with the fewest bits for these gaps (the smallest on a tie)."""
    if gaps.size == 0:
        return 0
    return int(np.argmin(order_costs(gaps)))


def encode_indices(indices: np.ndarray) -> np.ndarray:
    """Code sorted unique non-negative ``indices`` into a uint8 array (header + bits)."""
    gaps = _gaps(indices)
    n = gaps.size
    if n >= 1 << 32:
        raise ValueError("too many indices for a uint32 count")
    k = best_order(gaps)
    v = (gaps >> k) + 1
    lengths = _bit_lengths(v)
    # unary stream: L ones then a zero, per index
    unary = np.ones(int(lengths.sum()) + n, dtype=np.uint8)
    unary[np.cumsum(lengths + 1) - 1] = 0
    # mantissa stream: the L bits of v below its leading one, MSB first
    total_m = int(lengths.sum())
    owner = np.repeat(np.arange(n), lengths)
    starts = np.cumsum(lengths) - lengths
    pos_in = np.arange(total_m) - starts[owner]
    shift = lengths[owner] - 1 - pos_in
    mantissa = ((v[owner] >> shift) & 1).astype(np.uint8)
    # low-bits stream: k bits of each gap, MSB first
    if k:
        low = ((gaps[:, None] >> np.arange(k - 1, -1, -1)) & 1).astype(np.uint8).reshape(-1)
    else:
        low = np.zeros(0, dtype=np.uint8)
    bits = np.packbits(np.concatenate([unary, mantissa, low]))
    header = np.frombuffer(np.uint32(n).tobytes() + np.uint8(k).tobytes(), dtype=np.uint8)
    return np.concatenate([header, bits])


def decode_indices(data: np.ndarray) -> tuple[np.ndarray, int]:
    """Inverse of :func:`encode_indices`: the indices (int64) and the bytes consumed."""
    buf = np.asarray(data, dtype=np.uint8)
    if buf.size < HEADER_BYTES:
        raise ValueError("index code shorter than its header")
    n = int(buf[:4].view("<u4")[0])
    k = int(buf[4])
    if n == 0:
        return np.zeros(0, dtype=np.int64), HEADER_BYTES
    bits = np.unpackbits(buf[HEADER_BYTES:])
    zeros = np.flatnonzero(bits == 0)[:n]
    if zeros.size < n:
        raise ValueError("index code truncated")
    lengths = np.diff(zeros, prepend=-1) - 1
    m0 = int(zeros[-1]) + 1
    total_m = int(lengths.sum())
    owner = np.repeat(np.arange(n), lengths)
    starts = np.cumsum(lengths) - lengths
    shift = lengths[owner] - 1 - (np.arange(total_m) - starts[owner])
    mbits = bits[m0 : m0 + total_m].astype(np.int64)
    v = np.left_shift(np.int64(1), lengths) + np.bincount(
        owner, weights=(mbits << shift).astype(np.float64), minlength=n
    ).astype(np.int64)
    l0 = m0 + total_m
    gaps = (v - 1) << k
    if k:
        low = bits[l0 : l0 + n * k].astype(np.int64).reshape(n, k)
        gaps += low @ (np.int64(1) << np.arange(k - 1, -1, -1, dtype=np.int64))
    end_bits = l0 + n * k
    if end_bits > bits.size:
        raise ValueError("index code truncated")
    return np.cumsum(gaps + 1) - 1, HEADER_BYTES + math.ceil(end_bits / 8)


def coded_bytes(n: int, k: int, gaps: np.ndarray) -> int:
    """Size formula of a code: header + ceil((sum(2L+1) + n*k) / 8) bytes."""
    return HEADER_BYTES + math.ceil(_cost_bits(gaps, k) / 8) if n else HEADER_BYTES


def empirical_entropy_bits(indices: np.ndarray) -> float:
    """Zeroth-order empirical entropy of the gaps, in bits per index (the ideal coder's cost)."""
    gaps = _gaps(indices)
    if gaps.size == 0:
        return 0.0
    _, counts = np.unique(gaps, return_counts=True)
    p = counts / gaps.size
    return float(-(p * np.log2(p)).sum())
