"""The hierarchical allreduce with hosts faked per rank ($DISTTRAIN_HOST_ID), against gloo's own.

One world of 4 ranks on this host plays four layouts, each on a fresh group: 3 + 1
ranks per host (uneven), 2 + 2, one rank per host (= the inter-host ring) and one host
(= shm), with the pipeline's pieces small enough that the largest tensors go in many.
Integer-valued data equals ``dist.all_reduce`` exactly, random data is within tolerance
and bitwise equal on every rank; the meter's bytes sent and copied equal
``cost()`` for the layout ``$LOCAL_WORLD_SIZE`` states. (Not on the emulated cluster:
the hosts are faked; the cluster run is in benchmarks/RESULTS.md if it was made.)
"""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

from disttrain.comm.errors import UsageError
from tests.harness import run_world

LAYOUTS = {"3+1": ("aaab", 3), "2+2": ("aabb", 2), "1+1+1+1": ("abcd", 1), "4": ("aaaa", 4)}
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64]


def _body() -> list[tuple[str, str]]:
    import torch.distributed as dist

    from disttrain import collectives
    from disttrain.collectives import hierarchical
    from disttrain.collectives.hierarchical import HOST_ENV
    from disttrain.comm import forming, meter, world

    collectives.set_length_check(False)
    # pieces of 64 KiB: 300,001 entries run the pipeline (19-37 pieces, the last short),
    # 1,001 and fewer the one-piece path
    hierarchical.PIECE_BYTES = 64 * 1024
    algo = collectives.get("hierarchical")
    me = dist.get_rank()
    digests = []
    for label, (hosts, per) in LAYOUTS.items():
        os.environ[HOST_ENV] = hosts[me]
        os.environ["LOCAL_WORLD_SIZE"] = str(per)
        group = forming.new_group(list(range(4)), timeout=world.group_timeout())
        for dtype in DTYPES:
            for length in (1, 3, 1001, 300_001):
                gen = torch.Generator().manual_seed(length + me)
                x = torch.randint(-9, 10, (length,), generator=gen).to(dtype)
                expected = x.clone()
                dist.all_reduce(expected, group=group)
                meter.reset()
                algo.all_reduce(x, group)
                assert torch.equal(x, expected), (label, dtype, length)
                cost = algo.cost(length * x.element_size(), 4, me, x.element_size())
                got = (meter.bytes_sent, meter.messages_sent, meter.bytes_copied)
                assert got == (cost.bytes_sent, cost.messages, cost.bytes_copied), (label, got)
                if dtype.is_floating_point:
                    y = torch.randn(length, generator=gen).to(dtype)
                    ref = y.clone()
                    dist.all_reduce(ref, group=group)
                    algo.all_reduce(y, group)
                    tol = 6e-2 if dtype == torch.bfloat16 else 1e-5
                    torch.testing.assert_close(y, ref, rtol=tol, atol=tol)
                    raw = y.view(torch.uint8).numpy().tobytes()
                    digests.append((f"{label} {dtype} {length}", hashlib.sha1(raw).hexdigest()))
    return digests


def test_hierarchical_on_uneven_and_even_hosts_matches_gloo_bitwise_on_every_rank() -> None:
    results = run_world(_body, 4, timeout=300)
    assert all(r == results[0] for r in results)


def test_cost_by_layout() -> None:
    from disttrain import collectives

    algo = collectives.get("hierarchical")
    ring, shm = collectives.get("ring"), collectives.get("shm")
    os.environ["LOCAL_WORLD_SIZE"] = "3"
    try:  # 3 + 1: rank 0 leads host 0 (shm on 3, ring on 2 hosts, broadcast), rank 3 alone
        s = 4000
        c0, c1, c3 = (algo.cost(s, 4, r, 4) for r in (0, 1, 3))
        assert c0.bytes_sent == ring.cost(s, 2, 0, 4).bytes_sent == s
        assert c0.bytes_copied == shm.cost(s, 3, 0, 4).bytes_copied + s
        assert (c1.bytes_sent, c1.bytes_copied) == (0, shm.cost(s, 3, 1, 4).bytes_copied + s)
        assert (c3.bytes_sent, c3.bytes_copied) == (ring.cost(s, 2, 1, 4).bytes_sent, 0)
    finally:
        del os.environ["LOCAL_WORLD_SIZE"]
    assert algo.cost(4000, 4, 1, 4) == shm.cost(4000, 4, 1, 4)  # one host (no env): shm


def test_critical_path_on_one_host_is_shms_and_one_rank_per_host_the_networks() -> None:
    # the pipelined chain applies only with both phases: on one host (no $LOCAL_WORLD_SIZE)
    # the whole tensor's shm path, with one rank per host the inter algorithm's
    from disttrain.collectives.paths import path_of

    nbytes = 8 << 20  # several pipeline pieces
    assert path_of("hierarchical", nbytes, 4, 4) == path_of("shm", nbytes, 4, 4)
    os.environ["LOCAL_WORLD_SIZE"] = "1"
    try:
        assert path_of("hierarchical", nbytes, 4, 4) == path_of("ring", nbytes, 4, 4)
    finally:
        del os.environ["LOCAL_WORLD_SIZE"]


def test_the_inter_algorithm_is_its_own_setting_read_from_the_runs_config() -> None:
    """--inter-algorithm lives in hierarchical's section: a run's config builds the algorithm
    with it (no process-wide state); get() is the default (ring) whatever a run chose."""
    from disttrain import collectives, config
    from disttrain.collectives.costs import pricing_layout
    from disttrain.collectives.hierarchical import Hierarchical, HierarchicalConfig
    from disttrain.collectives.paths import path_of, steps_formula

    cfg = config.load({"algorithm": "hierarchical", "inter_algorithm": "tree"})
    assert cfg.section(HierarchicalConfig).inter_algorithm == "tree"
    assert config.section_fields()["inter_algorithm"][0] is HierarchicalConfig  # not TrainConfig
    built = collectives.build("hierarchical", cfg)
    tree, ring = collectives.get("tree"), collectives.get("ring")
    default = collectives.get("hierarchical")
    assert isinstance(built, Hierarchical) and isinstance(default, Hierarchical)
    assert built.inter is tree and default.inter is ring
    with pricing_layout(1):  # one rank per host: the inter algorithm alone
        assert built.cost(4000, 4, 1, 4) == tree.cost(4000, 4, 1, 4)
        assert path_of(built, 4000, 4, 4) == path_of("tree", 4000, 4, 4)
        assert steps_formula(built, 4) == steps_formula("tree", 4)
    with pricing_layout(2):
        assert "tree among 2 hosts" in path_of(built, 8 << 20, 4, 4).bandwidth_formula


@pytest.mark.parametrize(
    ("inter", "message"),
    [
        ("shm", "--inter-algorithm shm: choose an algorithm that crosses hosts"),
        ("hierarchical", "--inter-algorithm hierarchical: choose an algorithm that crosses"),
        ("gossip", "--inter-algorithm 'gossip': unknown allreduce algorithm; choose one of"),
    ],
)
def test_an_inter_algorithm_that_does_not_cross_hosts_is_refused(inter: str, message: str) -> None:
    from disttrain import config

    with pytest.raises(UsageError, match=message):
        config.load({"algorithm": "hierarchical", "inter_algorithm": inter})
