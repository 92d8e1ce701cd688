"""What the nodes' NICs deliver to NCCL: hardware.inter_node against the figures it cites."""

from __future__ import annotations

import math

import pytest

from disttrain.lab.scenario import hardware as hw

GBIT = 1e9 / 8


def test_rdma_with_a_nic_beside_every_two_gpus_gets_the_fabric_s_share() -> None:
    achieved, cap = hw.inter_node("infiniband", 800 * GBIT, 4, 8)
    assert achieved == pytest.approx(0.93 * 800 * GBIT)
    assert cap == math.inf
    assert hw.inter_node("roce", 400 * GBIT, 4, 8)[0] == pytest.approx(0.75 * 400 * GBIT)


def test_one_nic_under_eight_gpus_gets_the_host_staged_share() -> None:
    # 100 Gbit/s IB under 8 GPUs: 0.61 * 12.5 GB/s, not 0.93
    assert hw.inter_node("infiniband", 100 * GBIT, 1, 8)[0] == pytest.approx(0.61 * 12.5e9)
    assert hw.inter_node("roce", 100 * GBIT, 1, 8)[0] == pytest.approx(0.61 * 12.5e9)
    assert hw.inter_node("infiniband", 100 * GBIT, 1, 2)[0] == pytest.approx(0.93 * 12.5e9)


def test_tcp_runs_near_line_rate_at_10gbit_but_its_connections_cap_100gbit() -> None:
    def busbw(gbit: float) -> float:
        achieved, cap = hw.inter_node("tcp", gbit * GBIT, 1, 8)
        return min(achieved, cap)

    assert busbw(10) / (10 * GBIT) == pytest.approx(0.95)
    assert busbw(100) == pytest.approx(2 * 2.06e9)  # 2 channels x 2.06 GB/s
    assert busbw(100) / (100 * GBIT) == pytest.approx(0.33, abs=0.01)
    assert hw.inter_node("tcp", 100 * GBIT, 2, 8)[1] == pytest.approx(4 * 2.06e9)
