"""Index coding round-trips on adversarial index sets, and its size against the entropy."""

from __future__ import annotations

import numpy as np
import pytest

from disttrain.compression.index_coding import (
    HEADER_BYTES,
    coded_bytes,
    decode_indices,
    empirical_entropy_bits,
    encode_indices,
)

_RNG = np.random.default_rng(0)
CASES = {
    "empty": np.zeros(0, dtype=np.int64),
    "one_at_zero": np.array([0]),
    "one_far": np.array([2**31 + 5]),
    "all": np.arange(4096),
    "clustered": np.concatenate([np.arange(10, 300), np.arange(700_000, 700_040), [999_999]]),
    "random_sparse": np.sort(_RNG.choice(1_000_000, 3000, replace=False)),
    "every_other": np.arange(0, 10_000, 2),
    "powers_of_two": 2 ** np.arange(40),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip_and_self_delimiting(name: str) -> None:
    idx = CASES[name].astype(np.int64)
    code = encode_indices(idx)
    trailing = np.array([0, 255, 0], dtype=np.uint8)
    decoded, used = decode_indices(np.concatenate([code, trailing]))
    np.testing.assert_array_equal(decoded, idx)
    assert used == code.size
    gaps = np.diff(idx, prepend=-1) - 1
    assert coded_bytes(idx.size, int(code[4]), gaps) == code.size


def test_all_indices_cost_one_bit_each() -> None:
    code = encode_indices(np.arange(8000))
    assert code.size == HEADER_BYTES + 1000


def test_random_positions_code_near_the_empirical_entropy() -> None:
    # Uniform random positions at density 1/200: gaps are ~geometric, whose
    # entropy is ~log2(e*200) = 9.09 bits; exp-Golomb should be within ~0.6 bit.
    idx = np.sort(np.random.default_rng(1).choice(2_000_000, 10_000, replace=False))
    bits = 8 * (encode_indices(idx).size - HEADER_BYTES) / idx.size
    assert empirical_entropy_bits(idx) <= bits <= empirical_entropy_bits(idx) + 0.7


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError):
        encode_indices(np.array([3, 1]))
    with pytest.raises(ValueError):
        encode_indices(np.array([1, 1]))
    with pytest.raises(ValueError):
        decode_indices(encode_indices(np.arange(0, 100, 7))[:-3])


def _brute_force_costs(gaps: np.ndarray) -> list[int]:
    """Every order's size, one order at a time, straight from the code's definition."""
    out = []
    for k in range(32):
        v = (gaps.astype(np.int64) >> k) + 1
        lengths = [int(x).bit_length() - 1 for x in v]
        out.append(sum(2 * length + 1 + k for length in lengths))
    return out


_ADVERSARIAL = {
    **CASES,
    # clusters plus one long jump: the mean gap is large, the best order is 0
    "clusters_and_a_jump": np.concatenate([np.arange(0, 400), [3_000_000_000]]),
    "all_ones_gaps": np.cumsum(np.full(300, (1 << 12) - 1 + 1)) - 1,  # gaps 2^12 - 1: carries
    "mixed_scales": np.cumsum(_RNG.choice([1, 2, 1 << 10, 1 << 20, (1 << 30) - 1], 500)),
    "geometric_large": np.sort(_RNG.choice(2**40, 2000, replace=False)),
}


@pytest.mark.parametrize("name", sorted(_ADVERSARIAL))
def test_the_chosen_order_is_the_true_optimum(name: str) -> None:
    from disttrain.compression.index_coding import best_order, order_costs

    idx = np.unique(_ADVERSARIAL[name].astype(np.int64))
    gaps = np.diff(idx, prepend=-1) - 1
    brute = _brute_force_costs(gaps)
    assert order_costs(gaps).tolist() == brute  # every order's size, exactly
    k = best_order(gaps)
    assert brute[k] == min(brute) and k == brute.index(min(brute))
    code = encode_indices(idx)
    assert int(code[4]) == k
    assert code.size == HEADER_BYTES + -(-min(brute) // 8)


def test_the_clustered_set_of_the_review_gets_order_zero() -> None:
    # The trust review: +-4 around log2(mean gap) picked k=7 (2,694 bits) where k=0 needs 411.
    idx = CASES["clustered"].astype(np.int64)
    code = encode_indices(idx)
    assert int(code[4]) == 0
    assert 8 * (code.size - HEADER_BYTES) < 420
