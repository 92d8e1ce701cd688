"""The registry of algorithms, what each one's kind states for the lab, and the process-wide
switches."""

from __future__ import annotations

import ast
import inspect

import pytest
import torch
from torch.distributed import ProcessGroup

from disttrain import collectives
from disttrain.collectives import checks, chunks
from disttrain.collectives.base import Op
from disttrain.collectives.costs import NOTHING, Cost
from disttrain.collectives.paths import path_of, steps_formula
from disttrain.comm.errors import UsageError
from disttrain.registry import load_plugins
from tests.harness import SharedWorlds

load_plugins()  # $DISTTRAIN_PLUGINS: an out-of-tree algorithm is checked as every other


def test_files_register_in_name_order() -> None:
    assert list(collectives.ALGORITHMS) == [
        "alltoall",
        "auto",
        "butterfly",
        "halving_doubling",
        "hierarchical",
        "native",
        "ring",
        "roundrobin",
        "shm",
        "star",
        "tree",
    ]
    assert ", ".join(collectives.ALGORITHMS).startswith("alltoall, auto, butterfly")


def test_unknown_name_is_the_usage_error_listing_the_choices() -> None:
    with pytest.raises(UsageError) as info:
        collectives.get("gossip")
    message = str(info.value)
    assert message.startswith("--algorithm 'gossip': unknown allreduce algorithm; choose one of")
    assert all(name in message for name in collectives.ALGORITHMS)
    with pytest.raises(UsageError):
        collectives.all_reduce(torch.ones(2), "gossip")


def test_what_each_kind_states_for_the_lab() -> None:
    table = sorted((a.table_position, n) for n, a in collectives.ALGORITHMS.items())
    # the seed lectures' four, then the shared-memory ones
    seed_and_shm = ["star", "tree", "butterfly", "ring", "shm", "hierarchical"]
    assert [n for p, n in table if p] == seed_and_shm
    calibrated = [n for n, a in collectives.ALGORITHMS.items() if a.calibrates]
    assert calibrated == ["alltoall", "ring", "star", "tree"]
    assert [n for n, a in collectives.ALGORITHMS.items() if a.estimated] == ["native"]
    steps = {n: steps_formula(n, 6) for n in collectives.ALGORITHMS}
    assert steps == {
        "alltoall": "1",
        "auto": "by size: native",  # no table: the backend's own for every size
        "butterfly": "-",
        "halving_doubling": "-",
        "native": "-",
        "ring": "10",
        "roundrobin": "10",
        "star": "2",
        "tree": "4",
        "shm": "2 per piece",
        "hierarchical": "2 per piece",
    }
    assert [n for n, a in collectives.ALGORITHMS.items() if a.one_host] == ["shm"]
    assert [n for n, a in collectives.ALGORITHMS.items() if a.shards] == ["native", "ring"]
    assert steps_formula("butterfly", 8) == "3"
    assert steps_formula("halving_doubling", 8) == "6"
    assert [n for n, a in collectives.ALGORITHMS.items() if a.reads_settings] == [
        "auto",
        "hierarchical",
    ]
    assert collectives.ALGORITHMS.get("hierarchical").reads_settings == ("inter_algorithm",)


@pytest.mark.parametrize("name", list(collectives.ALGORITHMS))
def test_nothing_to_send_has_an_empty_path(name: str) -> None:
    assert path_of(name, 0, 8, 4) == NOTHING
    assert path_of(name, 4096, 1, 4) == NOTHING


class _Uneven(collectives.AllReduceAlgorithm):
    """Not registered: only its cost() matters (rank 1 is the busiest)."""

    name = "uneven"

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        raise NotImplementedError

    def cost(
        self,
        nbytes: int,
        world_size: int,
        rank: int = 0,
        itemsize: int = 1,
        op: Op = "all_reduce",
    ) -> Cost:
        return Cost(nbytes * (2 if rank == 1 else 1), 3 if rank == 1 else 1)


def test_the_default_terms_are_the_busiest_ranks_sends_in_sequence_and_no_formula() -> None:
    terms = collectives.AlgorithmKind(_Uneven).cost_terms  # what a kind states by default
    path = terms.chain(_Uneven(), 1000, 4, 4)
    assert (path.steps, path.critical_bytes, path.reduced_bytes) == (3, 2000, 2000)
    assert (path.bytes_per_rank, path.messages_per_rank) == (2000, 3)
    assert terms.steps(_Uneven(), 4) == "-"
    assert "uneven" not in collectives.ALGORITHMS


def test_a_registered_kind_is_the_registry_entry_and_get_its_default_runtime() -> None:
    kind = collectives.register(collectives.AlgorithmKind(_Uneven, calibrates=True))
    try:
        assert collectives.ALGORITHMS.get("uneven") is kind and kind.name == "uneven"
        assert collectives.get("uneven") is collectives.get("uneven") is kind.default
        assert isinstance(kind.default, _Uneven) and kind.reads_settings == ()
        assert path_of("uneven", 1000, 4, 4).steps == 3
    finally:
        collectives.ALGORITHMS.remove("uneven")


def test_switches_are_plain_module_state() -> None:
    assert collectives.length_check_enabled()
    assert collectives.set_length_check(False) is True
    try:
        assert not collectives.length_check_enabled()
    finally:
        assert collectives.set_length_check(True) is False
    assert checks.set_checks_everywhere(True) is False
    assert checks.set_checks_everywhere(False) is True and not checks.checks_everywhere()
    old = chunks.set_segment_bytes(1024)
    try:
        assert chunks.segment_bytes() == 1024
    finally:
        chunks.set_segment_bytes(old)


def test_checks_does_not_import_the_registry() -> None:
    """checks <- base, never back: base registers each algorithm's operation name in checks."""
    tree = ast.parse(inspect.getsource(checks))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("disttrain.collectives")}
    assert f"allreduce/ring/{torch.float32}" in _learned_names()


def _learned_names() -> set[str]:
    checks._learn_names()
    return set(checks._NAMES.values())


def _sums_and_sends_what_it_states(name: str) -> tuple[bool, tuple[int, int], tuple[int, int]]:
    """On this rank: (the sum equals torch's, bytes and messages metered, what cost() says)
    for a 1001-element float32 allreduce (odd: uneven chunks)."""
    import torch.distributed as dist

    from disttrain.comm import meter

    me, n = dist.get_rank(), dist.get_world_size()
    x = torch.randn(1001, generator=torch.Generator().manual_seed(me))
    expected = x.clone()
    dist.all_reduce(expected)
    algo = collectives.get(name)
    meter.reset()
    algo.all_reduce(x, checked=False)
    sent = (meter.bytes_sent, meter.messages_sent)
    cost = algo.cost(x.numel() * 4, n, me, 4)
    return torch.allclose(x, expected, atol=1e-5), sent, (cost.bytes_sent, cost.messages)


#: every registered algorithm (a plug-in's too: $DISTTRAIN_PLUGINS) in one 3-rank world
EACH = SharedWorlds(
    {name: (3, _sums_and_sends_what_it_states, (name,)) for name in collectives.ALGORITHMS},
    timeout=120,
)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", list(collectives.ALGORITHMS))
def test_each_algorithm_sums_as_torch_and_sends_what_its_cost_says(name: str) -> None:
    for rank, (equal, sent, stated) in enumerate(EACH.get(name)):
        assert equal, f"{name}: rank {rank}'s sum differs from torch's"
        if not collectives.ALGORITHMS.get(name).estimated:  # native: gloo's own sends
            assert sent == stated, f"{name}: rank {rank} sent {sent}, cost() says {stated}"
