"""Forming a process group, and forming it again when gloo fails to connect its ranks.

gloo's TCP listener hands each connection it accepts to whichever of its pairs waits for
the sequence number in the connection's first 8 bytes, small numbers (0 .. N-1). A stray
connection (most likely a pair of a dying group elsewhere, retrying its connect to a port
the OS has since given to a new listener) thus takes a pair's place and closes: the
group's connectFullMesh fails with "Connection closed by peer", or the group forms with
a dead pair and its first collective fails so (benchmarks/forming_strays.py, RESULTS
"Forming the group": 43 of 100 4-rank formations failed with a stray at one listener in
five, 0 of 100 with three tries). A new try meets on new listeners, so it forms.

Each try is collective. Every rank forms the group, checks each of its pairs (one
``all_to_all``: a dead pair fails it at once) and then says in the store how its try
went (:class:`_Meeting`); all ranks read every rank's word and go on, try again or
raise, together. A rank whose group formed while another's failed leaves its group and
tries again too. At most :data:`TRIES` tries, and only gloo's connect failures are
tried again; any other failure is raised as before. The lowest failed rank writes one
line on stderr for each new try.

A rank whose try failed first wakes those of its peers that are still connecting: a peer
that waits for this rank's connection on its listener would otherwise wait five times
the timeout (gloo's ``Pair::waitUntil``) before its try ends, and the others would stop
waiting for its word long before that.
"""

from __future__ import annotations

import contextlib
import functools
import socket
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["TRIES", "form_default", "is_connect_failure", "new_group", "summary"]

#: Tries of one group's formation, the first included.
TRIES = 3

#: gloo's words for a failed connect, in any try; the first one is what torch says when
#: anything in gloo's mesh fails, the others what a pair says when its peer went away
CONNECT_FAILURES = (
    "connectFullMesh failed",
    "Connection closed by peer",
    "Connection reset by peer",
)
#: what the retry line names, besides connectFullMesh, in this order
_DETAILS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Connection refused",
    "Connect timeout",
    "timed out connecting",
)

OK, CONNECT, OTHER = "ok", "connect", "other"

#: gloo devices of one backend looked at by the wake-up (one per interface)
_MAX_DEVICES = 8


def is_connect_failure(error: BaseException) -> bool:
    """gloo failed to connect the ranks (worth a new try), not any other failure."""
    return isinstance(error, RuntimeError) and any(s in str(error) for s in CONNECT_FAILURES)


def summary(error: BaseException) -> str:
    """gloo's message in a few words: ``connectFullMesh failed: Connection closed by peer``."""
    text = str(error)
    words = [s for s in (CONNECT_FAILURES[0], *_DETAILS) if s in text][:2]
    if words:
        return ": ".join(words)
    lines = text.strip().splitlines()
    return (lines[0] if lines else type(error).__name__)[:200]


def _outcome(error: BaseException | None) -> str:
    if error is None:
        return OK
    return CONNECT if is_connect_failure(error) else OTHER


class _Meeting:
    """One try of one group in the store: each rank's word on how it went, and the
    addresses gloo's ranks posted there (for :meth:`wake_peers`).

    ``words``: where the ranks of the whole world say how their try went (a rank outside
    a sub-group says ok); ``gloo``: the group's keys (``<group name>/``), under which
    each backend's ranks post their listener; ``members``: the group's global ranks, in
    the group's order.
    """

    def __init__(
        self,
        words: dist.Store,
        gloo: dist.Store,
        members: list[int],
        rank: int,
        world_size: int,
        timeout: timedelta,
    ) -> None:
        self.words, self.gloo, self.members = words, gloo, members
        self.rank, self.world_size, self.timeout = rank, world_size, timeout

    def _key(self, rank: int) -> str:
        return f"outcome/{rank}"

    def say(self, error: BaseException | None) -> None:
        text = "" if error is None else summary(error)
        self.words.set(self._key(self.rank), f"{_outcome(error)} {text}")

    def hear(self, error: BaseException | None) -> dict[int, tuple[str, str]]:
        """Every rank's (outcome, summary), waiting for them up to the timeout; on the
        timeout, raises this rank's own error, else says who did not answer."""
        keys = [self._key(r) for r in range(self.world_size)]
        try:
            self.words.wait(keys, self.timeout)
        except RuntimeError as exc:  # DistStoreError: the wait timed out
            if error is not None:
                raise error from None
            silent = [r for r, k in enumerate(keys) if not self.words.check([k])]
            raise RuntimeError(
                f"ranks {silent} did not say within {self.timeout.total_seconds():g} s "
                "whether they formed the process group"
            ) from exc
        words = {}
        for r, key in enumerate(keys):
            outcome, _, text = self.words.get(key).decode().partition(" ")
            words[r] = (outcome, text)
        return words

    def wake_peers(self) -> None:
        """Dial each member still connecting (no word yet) as this rank would have, and
        close: one that waits for this rank's connection fails at once ("Connection
        closed by peer") instead of after five times the timeout. Best effort: a peer
        whose address cannot be read is left to its timeout."""
        me = self.members.index(self.rank)
        for g, r in enumerate(self.members):
            if r == self.rank or self.words.check([self._key(r)]):
                continue  # a rank that gave its word has ended its try: its port is free
            for device in _gloo_devices():
                with contextlib.suppress(Exception):  # no address: nothing to wake
                    self._wake(dist.PrefixStore(f"{device}/", self.gloo), g, me)

    def _wake(self, backend: dist.Store, g: int, me: int) -> None:
        """Dial group rank ``g``'s listener of each gloo device of one backend: torch's
        ProcessGroupGloo has one device per interface (``GLOO_SOCKET_IFNAME=a,b``), whose
        ranks post their records under the device's index (``0/<rank>``)."""
        for i in range(_MAX_DEVICES):
            store = dist.PrefixStore(str(i), backend)
            if not store.check([str(g)]):
                return
            _dial(bytes(store.get(str(g))), me)


def _gloo_devices() -> list[str]:
    """The devices a gloo group has a backend for (each its own listener): cpu, cuda."""
    config = dist.distributed_c10d.BackendConfig(dist.Backend("gloo"))
    return list(config.get_device_backend_map())


def _dial(info: bytes, me: int) -> None:
    """Connect to the listener in gloo's rank record ``info`` and send the sequence number
    that listener waits for from group rank ``me``, then close.

    The record (gloo/transport/tcp/context.cc, ``Rank::bytes``): the host name's length
    (8 bytes) and the name, the address's length and the address (a ``sockaddr_storage``
    then the sequence number), then one 8-byte sequence number per pair (none where gloo
    uses ranks as sequence numbers).
    """
    n = int.from_bytes(info[:8], "little")
    at = 8 + n
    size = int.from_bytes(info[at : at + 8], "little")
    address = info[at + 8 : at + 8 + size]
    pairs = info[at + 8 + size :]
    family = int.from_bytes(address[:2], sys.byteorder)
    port = int.from_bytes(address[2:4], "big")
    if family == socket.AF_INET:
        host = socket.inet_ntop(socket.AF_INET, address[4:8])
    elif family == socket.AF_INET6:
        host = socket.inet_ntop(socket.AF_INET6, address[8:24])
    else:
        return
    seq = int.from_bytes(pairs[8 * me : 8 * me + 8], "little", signed=True) if pairs else me
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        sock.connect((host, port))
        sock.sendall(seq.to_bytes(8, "little", signed=True))


def _check(group: Any, size: int, rank: int) -> None:
    """Every pair of the group carries one message: an ``all_to_all`` sends on each, so a
    pair whose peer is gone fails here, in the try, not in the job's first step."""
    sent = torch.arange(size, dtype=torch.int64) + rank * size
    got = torch.empty(size, dtype=torch.int64)
    dist.all_to_all_single(got, sent, group=group)
    if got.tolist() != [r * size + rank for r in range(size)]:
        raise RuntimeError(f"the new process group's check gave {got.tolist()}")


def _verdict(
    meeting: _Meeting,
    error: BaseException | None,
    k: int,
    sub: list[int] | None,
    leave: Callable[[], None],
) -> bool:
    """After try ``k``: True if every rank formed the group; False if all try again
    (the lowest failed rank says so on stderr); raises if not.

    ``sub``: a sub-group's ranks (None: the default group); ``leave`` drops this rank's
    group, where it formed but another rank's did not."""
    if error is not None:
        meeting.wake_peers()  # before its word: until then no peer has begun a new try
    meeting.say(error)
    if error is not None and (_outcome(error) == OTHER or k == TRIES):
        raise error  # no new try can follow: the others learn it from the word
    words = meeting.hear(error)
    failed = [r for r, (outcome, _) in words.items() if outcome != OK]
    if not failed:
        return True
    if error is None:
        leave()
    first = failed[0]
    other = [r for r in failed if words[r][0] == OTHER]  # this rank's own was raised above
    if other or k == TRIES:
        # the cause, where another rank's failure is why this one's try failed or must end
        r = (other or failed)[0]
        group = "the group" if sub is None else f"sub-group {sub}"
        raise RuntimeError(f"rank {r} failed to form {group}: {words[r][1]}") from error
    if meeting.rank == first:
        ranks, it = ("the ranks", "the group") if sub is None else (f"the ranks of {sub}", "it")
        sys.stderr.write(
            f"disttrain: rank {first}: gloo failed to connect {ranks} ({words[first][1]}); "
            f"forming {it} again (try {k + 1} of {TRIES})\n"
        )
        sys.stderr.flush()
    return False


def form_default(
    backend: str, store: dist.Store, rank: int, world_size: int, timeout: timedelta
) -> None:
    """``init_process_group`` on ``store``; with gloo, tried again (all ranks together, at
    most :data:`TRIES` tries) when gloo fails to connect the ranks. Try k meets under
    ``form/<k>`` of the store: fresh keys, so no rank reads another try's addresses."""
    if backend != "gloo" or world_size == 1:  # NCCL connects lazily; one rank has no pairs
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
        return
    hook = sys.excepthook  # each formed group wraps it once more: one wrapping, not three
    members = list(range(world_size))
    for k in range(1, TRIES + 1):
        here = dist.PrefixStore(f"form/{k}", store)
        error = _default_once(backend, here, rank, world_size, timeout)
        # the default group is torch's group "0" (its count starts again at every destroy)
        meeting = _Meeting(here, dist.PrefixStore("0/", here), members, rank, world_size, timeout)
        if _verdict(meeting, error, k, None, _leave_default):
            return
        sys.excepthook = hook


def _default_once(
    backend: str, store: dist.Store, rank: int, world_size: int, timeout: timedelta
) -> BaseException | None:
    """One try of the default group, checked: None if it formed, else what failed."""
    try:
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
    except Exception as exc:
        # torch counted the failed group as "0": the next try must be "0" on every rank,
        # as on a rank that formed it and destroyed it (destroy sets the count to 0)
        dist.distributed_c10d._world.group_count = 0
        return exc
    try:
        _check(None, world_size, rank)
    except Exception as exc:
        error = _without_frames(exc)
        _leave_default()
        return error
    return None


def _without_frames(error: Exception) -> Exception:
    """``error`` without its traceback: the failed collective's frames hold its work and
    with it the group, whose sockets then stay open after the group is destroyed, and a
    peer whose pair is one of them waits out the timeout instead of failing at once."""
    return error.with_traceback(None)


def _leave_default() -> None:
    with contextlib.suppress(Exception):  # a group with a dead pair may fail to close
        dist.destroy_process_group()


def new_group(
    ranks: Sequence[int] | None = None,
    timeout: timedelta | None = None,
    *,
    use_local_synchronization: bool = False,
) -> Any:
    """``torch.distributed.new_group``, tried again like the default group (all ranks of
    the job together) when gloo fails to connect the sub-group's ranks.

    Called by every rank of the job, as torch's is; the agreement meets in the default
    group's store under ``form/<group name>``. Formed once, as torch does it, where the
    default group is not gloo's, and with ``use_local_synchronization`` (only the group's
    ranks call it, and torch names such a group by its ranks: a second try would meet
    on the first one's keys).
    """
    if use_local_synchronization or dist.get_backend() != "gloo" or dist.get_world_size() == 1:
        return dist.new_group(
            ranks, timeout=timeout, use_local_synchronization=use_local_synchronization
        )
    rank, world_size = dist.get_rank(), dist.get_world_size()
    members = sorted(range(world_size) if ranks is None else ranks)
    base = dist.distributed_c10d._get_default_store()
    for k in range(1, TRIES + 1):
        name = str(dist.distributed_c10d._world.group_count)  # the name torch gives it
        group, error = _sub_once(members, timeout, rank)
        meeting = _Meeting(
            dist.PrefixStore(f"form/{name}", base),
            dist.PrefixStore(f"{name}/", base),
            members,
            rank,
            world_size,
            timeout or timedelta(minutes=30),  # torch's default for gloo
        )
        if _verdict(meeting, error, k, members, functools.partial(_leave_sub, group)):
            return group
    raise AssertionError("unreachable: the last try returns or raises")


def _sub_once(members: list[int], timeout: timedelta | None, rank: int) -> tuple[Any, Any]:
    """One try of a sub-group, checked by its ranks: (the group, None) or (None, error)."""
    try:
        group = dist.new_group(members, timeout=timeout)
    except Exception as exc:
        return None, exc
    if rank not in members or len(members) == 1:
        return group, None
    try:
        _check(group, len(members), members.index(rank))
    except Exception as exc:
        error = _without_frames(exc)
        _leave_sub(group)
        return None, error
    return group, None


def _leave_sub(group: Any) -> None:
    if group is None or group == dist.GroupMember.NON_GROUP_MEMBER:
        return
    with contextlib.suppress(Exception):  # a group with a dead pair may fail to close
        dist.destroy_process_group(group)
