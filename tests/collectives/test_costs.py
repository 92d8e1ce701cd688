"""The cost statements against the closed forms of the literature (no processes needed).

For S divisible by n (and by p): ring and round-robin send 2(n-1)/n·S in
2(n-1) messages from every rank; halving-doubling 2(p-1)/p·S in 2·log2 p;
butterfly log2(n)·S; star S per leaf and (n-1)·S at the root; alltoall
(n-1)·S; tree S per tree edge, twice. The property tests check that the meter
agrees with these statements for every example they run.
"""

from __future__ import annotations

import pytest

from disttrain import collectives

S = 1 << 20  # divisible by every n below and by 4-byte items


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 8])
def test_bandwidth_optimal_algorithms_send_two_n_minus_one_over_n(n: int) -> None:
    S_n = S * n  # divisible by n
    for name in ("ring", "roundrobin", "native"):
        for rank in range(n):
            cost = collectives.get(name).cost(S_n, n, rank, 4)
            assert (cost.bytes_sent, cost.messages) == (2 * (n - 1) * S, 2 * (n - 1))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_power_of_two_halving_doubling_and_butterfly(n: int) -> None:
    log = n.bit_length() - 1
    for rank in range(n):
        hd = collectives.get("halving_doubling").cost(S, n, rank, 4)
        assert (hd.bytes_sent, hd.messages) == (2 * (n - 1) * S // n, 2 * log)
        bf = collectives.get("butterfly").cost(S, n, rank, 4)
        assert (bf.bytes_sent, bf.messages) == (log * S, log)


def test_non_power_of_two_folds_cost_one_extra_array_each_way() -> None:
    # n=6: p=4, ranks 0 and 2 sit out, 1 and 3 absorb them.
    bf = collectives.get("butterfly")
    assert [bf.cost(S, 6, r, 4).bytes_sent for r in range(6)] == [S, 3 * S, S, 3 * S, 2 * S, 2 * S]
    hd = collectives.get("halving_doubling")
    assert hd.cost(S, 6, 0, 4).bytes_sent == S
    assert hd.cost(S, 6, 1, 4).bytes_sent == S + 2 * 3 * S // 4
    assert hd.cost(S, 6, 5, 4).bytes_sent == 2 * 3 * S // 4


@pytest.mark.parametrize("n", [2, 3, 5, 6])
def test_star_alltoall_and_tree(n: int) -> None:
    star = collectives.get("star")
    assert star.cost(S, n, 0).bytes_sent == (n - 1) * S
    assert all(star.cost(S, n, r).bytes_sent == S for r in range(1, n))
    assert all(
        collectives.get("alltoall").cost(S, n, r).bytes_sent == (n - 1) * S for r in range(n)
    )
    tree = collectives.get("tree")
    # n-1 edges, each crossed once up and once down
    assert sum(tree.cost(S, n, r).bytes_sent for r in range(n)) == 2 * (n - 1) * S


def test_uneven_lengths_and_empty_chunks_are_counted_exactly() -> None:
    ring = collectives.get("ring")
    # 5 float32 elements on 4 ranks: chunks of 2,1,1,1 elements. Rank 0 skips
    # chunk 1 in the reduce-scatter and chunk 2 in the all-gather.
    assert ring.cost(20, 4, 0, 4).bytes_sent == 2 * 20 - 4 - 4
    # 2 elements on 4 ranks: chunks 1,1,0,0; rank 0 sends chunk 0 (reduce-scatter),
    # chunks 1 and 0 (all-gather); the empty chunks 2 and 3 are never sent.
    assert ring.cost(8, 4, 0, 4) == collectives.Cost(12, 3)
    for name in collectives.ALGORITHMS:
        assert collectives.get(name).cost(0, 4, 1, 4) == collectives.Cost(0, 0)
        assert collectives.get(name).cost(S, 1, 0, 4) == collectives.Cost(0, 0)
