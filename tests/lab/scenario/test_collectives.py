"""NCCL's ring and tree on two levels, against values worked by hand."""

from __future__ import annotations

import pytest

from disttrain.lab.scenario import collectives as coll

ONE_NODE = coll.Group(ranks=8, per_node=8, intra_bandwidth=100e9, intra_latency=2e-6)
TWO_NODES = coll.Group(
    ranks=16,
    per_node=8,
    intra_bandwidth=100e9,
    intra_latency=1e-6,
    net_bandwidth=25e9,
    net_latency=5e-6,
)


def test_ring_inside_one_node() -> None:
    # 2(n-1) = 14 hops of 2 us; 2*7/8 of 1 GB at 100 GB/s = 17.5 ms
    assert coll.ring_allreduce(1e9, ONE_NODE) == pytest.approx(14 * 2e-6 + 0.0175)


def test_ring_across_two_nodes_splits_its_hops_and_meets_the_nics() -> None:
    # NCCL's tuner across nodes: 8.4 us base, 2 of the 30 hops cross the network (5 us),
    # 28 stay inside at no less than its 3 us network overhead; the bottleneck is the
    # node's 25 GB/s: 2*15/16 * 100 MB / 25 GB/s = 7.5 ms
    want = coll.RING_BASE + 2 * 5e-6 + 28 * coll.NET_OVERHEAD + 0.0075
    assert coll.ring_allreduce(1e8, TWO_NODES) == pytest.approx(want)


def test_the_ring_s_plateau_multiplies_an_allreduce_s_latency_only() -> None:
    volta = coll.Group(16, 8, 100e9, 1e-6, 25e9, 5e-6, plateau=1.9)
    latency = coll.RING_BASE + 2 * 5e-6 + 28 * coll.NET_OVERHEAD
    assert coll.ring_allreduce(1e8, volta) == pytest.approx(1.9 * latency + 0.0075)
    gather = coll.RING_BASE + 5e-6 + 14 * coll.NET_OVERHEAD + 15 / 16 * 1e8 / 25e9
    assert coll.allgather(1e8, volta) == pytest.approx(gather)


def test_tree_across_two_nodes_sends_the_buffer_once_through_the_nics() -> None:
    # 2*log2(2) network hops and a 2*(8-1)-hop chain, 28 us each (NCCL's tree chunk);
    # 100 MB once through 25 GB/s (4 ms) outlasts 2 x 100 MB through 100 GB/s (2 ms);
    # at 0.92 of the ring's rate and NCCL's correction for 64 B * 2**20 (0.8)
    want = 2 * 28e-6 + 14 * 28e-6 + 1e8 / 25e9 / (coll.TREE_BANDWIDTH * 0.8)
    assert coll.tree_allreduce(1e8, TWO_NODES) == pytest.approx(want)


def test_tree_on_more_nodes_sends_it_twice() -> None:
    four = coll.Group(32, 8, 100e9, 1e-6, 25e9, 5e-6)
    want = 2 * 2 * 28e-6 + 14 * 28e-6 + 2e8 / 25e9 / (coll.TREE_BANDWIDTH * 0.8)
    assert coll.tree_allreduce(1e8, four) == pytest.approx(want)
    assert coll.tree_allreduce(1e9, four) == pytest.approx(
        2 * 2 * 28e-6 + 14 * 28e-6 + 2e9 / 25e9 / coll.TREE_BANDWIDTH  # no correction > 256 MB
    )


def test_a_collective_s_connections_cap_its_share_of_the_nics() -> None:
    capped = coll.Group(16, 8, 100e9, 1e-6, 25e9, 5e-6, sharing=2, net_cap=4e9)
    assert capped.bandwidth == pytest.approx(4e9)  # min(25/2, 4) GB/s
    assert coll.Group(16, 8, 100e9, 1e-6, 25e9, 5e-6, sharing=8, net_cap=4e9).bandwidth == (
        pytest.approx(25e9 / 8)
    )


def test_nccl_takes_the_tree_for_small_buffers_and_the_ring_for_large() -> None:
    big = coll.Group(
        ranks=512,
        per_node=8,
        intra_bandwidth=100e9,
        intra_latency=1e-6,
        net_bandwidth=25e9,
        net_latency=5e-6,
    )
    assert coll.allreduce(1e3, big, "nccl")[1] == "tree"
    assert coll.allreduce(1e9, big, "nccl")[1] == "ring"
    assert coll.allreduce(1e3, big, "gloo")[1] == "ring"  # gloo and MPI: a ring


def test_groups_sharing_a_node_share_its_nics() -> None:
    shared = coll.Group(16, 8, 100e9, 1e-6, 25e9, 5e-6, sharing=4)
    assert shared.bandwidth == pytest.approx(25e9 / 4)


def test_all_gather_is_half_an_allreduce_plus_half_the_hops() -> None:
    # (n-1) = 7 hops of 2 us; 7/8 of 1 GB at 100 GB/s
    assert coll.allgather(1e9, ONE_NODE) == pytest.approx(7 * 2e-6 + 0.00875)


def test_nothing_to_send_costs_nothing() -> None:
    alone = coll.Group(1, 1, 100e9, 1e-6)
    assert coll.ring_allreduce(1e9, alone) == 0.0
    assert coll.allgather(0.0, ONE_NODE) == 0.0
    assert coll.p2p(0.0, 1e9, 1e-6) == 0.0
    assert coll.p2p(1e6, 1e9, 1e-6) == pytest.approx(1e-6 + 1e-3)
