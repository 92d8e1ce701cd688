"""Forming a group again when gloo fails to connect its ranks (issue 51, comm/forming.py).

The failure is made on purpose, with a real stray (tests/comm/strays.py): one rank holds
back its part of the formation while it dials the others' new gloo listeners with every
small sequence number. Until that rank posts its address no rank connects, so every
listener holds the stray's closed connections before any peer's: the pair of each
connection that listener waits for takes a dead one, and the try fails.
"""

from __future__ import annotations

import re
import socket
import threading

import pytest

from disttrain.comm import forming
from tests.harness import RankError, run_world

LINE = re.compile(
    r"^disttrain: rank \d: gloo failed to connect (.*) \((.*)\); forming (.*) again "
    r"\(try (\d) of 3\)$",
    re.M,
)


def _pids_and_listeners() -> tuple[list[int], dict[int, set[tuple[str, int]]]]:
    """Every rank's pid and the sockets each listens on now (before the group to come)."""
    import os

    import torch.distributed as dist

    from tests.comm import strays

    pids: list[int] = [0] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    before = {pid: strays.listeners(pid) for pid in pids}
    dist.barrier()  # every rank's listeners read before any forms its next group
    return pids, before


def _form_beside_a_stray(tries: int, stray: int) -> tuple[float, str]:
    """Leave the group, form it again with a stray at the other ranks' listeners; the sum
    of the ranks over the new group and what this rank wrote on stderr."""
    import contextlib
    import io
    import os

    import torch
    import torch.distributed as dist

    from disttrain.comm import forming, world
    from tests.comm import strays

    rank, size = dist.get_rank(), dist.get_world_size()
    pids, before = _pids_and_listeners()
    world.shutdown()
    forming.TRIES = tries
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        if rank == stray:
            others = [p for p in pids if p != os.getpid()]
            strays.dial_new_listeners(others, before, range(size))
        world.init(timeout=5.0)
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    return total.item(), err.getvalue()


@pytest.mark.timeout(60)
def test_a_stray_at_the_listeners_fails_the_formation_without_a_new_try() -> None:
    with pytest.raises(RankError) as failed:
        run_world(_form_beside_a_stray, 3, args=(1, 2), timeout=40, grace=2)
    assert re.search("connectFullMesh failed|Connection closed by peer", str(failed.value))


@pytest.mark.timeout(60)
def test_with_a_new_try_the_group_forms_beside_a_stray_and_says_so_once() -> None:
    results = run_world(_form_beside_a_stray, 3, args=(3, 2), timeout=40)
    assert [total for total, _ in results] == [3.0] * 3  # 0 + 1 + 2 over the new group
    lines = [m for _, err in results for m in LINE.finditer(err)]
    assert len(lines) == 1, [err for _, err in results]
    what, why, again, nxt = lines[0].groups()
    assert (what, again, nxt) == ("the ranks", "the group", "2")
    assert why.startswith(forming.CONNECT_FAILURES), why


def _sub_group_beside_a_stray(stray: int, members: list[int]) -> tuple[float | None, str]:
    """A sub-group of ``members`` formed with a stray at the other members' listeners."""
    import contextlib
    import io

    import torch
    import torch.distributed as dist

    from disttrain.comm import forming, world
    from tests.comm import strays

    rank = dist.get_rank()
    pids, before = _pids_and_listeners()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        if rank == stray:
            others = [pids[r] for r in members if r != rank]
            strays.dial_new_listeners(others, before, range(len(members)))
        group = forming.new_group(members, timeout=world.group_timeout())
    if rank not in members:
        return None, err.getvalue()
    total = torch.tensor([float(rank)])
    dist.all_reduce(total, group=group)
    return total.item(), err.getvalue()


@pytest.mark.timeout(60)
def test_a_sub_group_is_formed_again_beside_a_stray_by_every_rank_of_the_job() -> None:
    results = run_world(
        _sub_group_beside_a_stray, 4, args=(3, [1, 2, 3]), timeout=40, collective_timeout=5.0
    )
    assert [total for total, _ in results] == [None, 6.0, 6.0, 6.0]
    lines = [m for _, err in results for m in LINE.finditer(err)]
    assert len(lines) == 1, [err for _, err in results]
    what, _, again, nxt = lines[0].groups()
    assert (what, again, nxt) == ("the ranks of [1, 2, 3]", "it", "2")


def _fail_otherwise_once(failing: int) -> None:
    """Form the group again; rank ``failing``'s first try fails, but not in gloo's connect."""
    import torch.distributed as dist

    from disttrain.comm import world

    rank = dist.get_rank()
    dist.barrier()
    world.shutdown()
    if rank == failing:
        real = dist.init_process_group

        def broken(*args: object, **kwargs: object) -> None:
            dist.init_process_group = real  # once
            raise RuntimeError("the store went away")

        dist.init_process_group = broken
    world.init(timeout=2.0)


@pytest.mark.timeout(60)
def test_any_other_failure_is_raised_on_every_rank_without_a_new_try() -> None:
    with pytest.raises(RankError) as failed:
        run_world(_fail_otherwise_once, 2, args=(1,), timeout=40, grace=10)
    text = str(failed.value)
    heads = sorted(text.split("\n\n")[0].splitlines())
    # rank 1's own error, not tried again (a second try would have formed: the fault
    # fires once); rank 0 waited for rank 1's address, and its wait ended at the timeout
    assert heads == [
        "rank 0: RuntimeError: Wait timeout",
        "rank 1: RuntimeError: the store went away",
    ], text


def test_only_gloos_connect_failures_are_tried_again() -> None:
    closed = RuntimeError(
        "Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:"
        "554] Connection closed by peer [127.0.0.1]:40123. This is typically caused by ..."
    )
    assert forming.is_connect_failure(closed)
    assert forming.summary(closed) == "connectFullMesh failed: Connection closed by peer"
    reset = RuntimeError("[pair.cc:562] Read error [127.0.0.1]:1: Connection reset by peer")
    assert forming.is_connect_failure(reset)
    assert forming.summary(reset) == "Connection reset by peer"
    assert not forming.is_connect_failure(RuntimeError("Timed out waiting for key 0/cpu/1"))
    assert not forming.is_connect_failure(ValueError("connectFullMesh failed"))


def test_the_wake_up_dials_the_listener_in_glooss_rank_record_with_its_sequence_number() -> None:
    """gloo's rank record (Rank::bytes): host name, address (sockaddr + seq), the pairs'
    sequence numbers; the wake-up sends the one the listener waits for from this rank."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        sockaddr = (
            socket.AF_INET.to_bytes(2, "little")
            + port.to_bytes(2, "big")
            + socket.inet_aton("127.0.0.1")
        ).ljust(128, b"\0")
        address = sockaddr + (-1).to_bytes(8, "little", signed=True)
        host = b"node-7"
        seqs = b"".join(s.to_bytes(8, "little", signed=True) for s in (10, 11, 12))
        record = len(host).to_bytes(8, "little") + host
        record += len(address).to_bytes(8, "little") + address + seqs
        got: list[bytes] = []

        def accept() -> None:
            conn, _ = server.accept()
            with conn:
                got.append(conn.recv(16))

        reader = threading.Thread(target=accept)
        reader.start()
        forming._dial(record, 1)
        reader.join(5)
    assert got == [(11).to_bytes(8, "little", signed=True)]
