"""Every algorithm against torch.distributed's own allreduce: property tests on real process groups.

Spawning a world costs seconds on this machine, so ONE world of 6 ranks runs
all the examples: it builds sub-groups of sizes 1 to 5 (contiguous and not)
besides the whole world, and hypothesis, derandomized, draws the same examples
on every rank (group, algorithm, dtype, length, seed). Each example asserts:

- the sum equals ``dist.all_reduce``'s on the same group: exactly for
  integer-valued data (small integers sum exactly in every dtype, bf16
  included), within rtol 1e-5 (float32) / 1e-12 (float64) for normal data;
- every rank of the group holds bitwise the same result;
- the meter counted exactly ``cost(nbytes, n, rank, itemsize)`` bytes and
  messages (plus the length check's own, when it is on).

After each example all six ranks agree on pass/fail, so a failure stops every
rank at the same example instead of leaving the others waiting.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from tests.harness import run_world

#: Sub-groups built in the 6-rank world (None: the whole world); every size 1..6.
GROUPS: list[list[int] | None] = [None, [0, 1, 2, 3, 4], [1, 2, 4, 5], [0, 3, 5], [2, 4], [3]]
DTYPES = ["float32", "float64", "bfloat16", "float16", "int64"]
EXAMPLES = 160


def _examples(examples: int) -> dict[str, Any]:
    import torch.distributed as dist
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    from disttrain import collectives
    from disttrain.collectives import checks
    from disttrain.comm import forming, meter

    me = dist.get_rank()
    groups = [None if g is None else forming.new_group(g) for g in GROUPS]
    members = [list(range(6)) if g is None else g for g in GROUPS]
    ours = [a for a in collectives.ALGORITHMS if a != "native"]
    seen: list[tuple[str, int, int, str]] = []

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        gi=st.integers(0, len(GROUPS) - 1),
        algorithm=st.sampled_from(ours),
        dtype=st.sampled_from(DTYPES),
        length=st.one_of(st.integers(0, 13), st.integers(0, 700), st.integers(0, 20000)),
        seed=st.integers(0, 2**31 - 1),
        normal=st.booleans(),
        check=st.booleans(),
    )
    def example(
        gi: int, algorithm: str, dtype: str, length: int, seed: int, normal: bool, check: bool
    ) -> None:
        error = ""
        if me in members[gi]:
            try:
                _one(gi, algorithm, dtype, length, seed, normal, check)
                seen.append((algorithm, len(members[gi]), length, dtype))
            except Exception as exc:
                error = f"rank {me}: {type(exc).__name__}: {exc}"
                # said now: if the ranks' collectives went out of step, gloo aborts the
                # process at the next one and this line is all that is left of the cause
                print(f"example gi={gi} {algorithm} {dtype} {length}: {error}", file=sys.stderr)
        flag = torch.tensor([1 if error else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if error:
            raise AssertionError(error)
        if int(flag):
            raise AssertionError("another rank failed this example")

    def _one(
        gi: int, algorithm: str, dtype: str, length: int, seed: int, normal: bool, check: bool
    ) -> None:
        group, n = groups[gi], len(members[gi])
        rank = dist.get_rank(group)
        torch_dtype = getattr(torch, dtype)
        gen = torch.Generator().manual_seed(seed * 7 + me)
        floating = torch_dtype.is_floating_point and dtype in ("float32", "float64")
        if normal and floating:
            data = torch.randn(length, generator=gen, dtype=torch.float64).to(torch_dtype)
        else:
            data = torch.randint(-16, 17, (length,), generator=gen).to(torch_dtype)
        expected = data.clone()
        dist.all_reduce(expected, group=group)
        old = collectives.set_length_check(check)
        try:
            meter.reset()
            out = collectives.all_reduce(data, algorithm, group)
            sent = (meter.bytes_sent, meter.messages_sent)
        finally:
            collectives.set_length_check(old)
        # every collective of the example comes before any check, so a check that fails on
        # one rank never leaves it in a different collective from the others
        everyone = [torch.empty_like(data) for _ in range(n)]
        if n > 1 and length:
            dist.all_gather(everyone, data, group=group)
        assert out is data, "all_reduce must work in place and return its argument"
        if normal and floating:
            tol = 1e-5 if dtype == "float32" else 1e-12
            torch.testing.assert_close(data, expected, rtol=tol, atol=tol * n)
        else:
            assert torch.equal(data, expected), f"{algorithm} differs from native"
        cost = collectives.get(algorithm).cost(
            length * data.element_size(), n, rank, data.element_size()
        )
        extra = checks.check_cost_bytes(n) if check else (0, 0)
        want = (cost.bytes_sent + extra[0], cost.messages + extra[1])
        assert sent == want, f"{algorithm} n={n} rank {rank}: meter {sent} != cost {want}"
        if n > 1 and length:
            assert all(torch.equal(e, data) for e in everyone), "ranks disagree bitwise"

    example()
    return {"seen": seen}


def test_every_algorithm_matches_native_on_groups_of_1_to_6_ranks() -> None:
    results = run_world(_examples, 6, args=(EXAMPLES,), timeout=170, collective_timeout=60)
    seen = [s for r in results for s in r["seen"]]
    # The examples really covered the space: every algorithm, group size and dtype.
    assert {s[0] for s in seen} >= {
        "ring",
        "tree",
        "butterfly",
        "halving_doubling",
        "star",
        "alltoall",
        "roundrobin",
    }
    assert {s[1] for s in seen} == {1, 2, 3, 4, 5, 6}
    assert {s[3] for s in seen} == set(DTYPES)
    lengths = {s[2] for s in seen}
    assert 0 in lengths and any(0 < x < 6 for x in lengths) and max(lengths) > 1000
