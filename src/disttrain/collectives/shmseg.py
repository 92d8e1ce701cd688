"""A shared-memory segment for the ranks of one group on one host, and its barrier.

The segment is a file in /dev/shm created by the group's rank 0 with
``O_CREAT|O_EXCL`` and mode 0600 (created only by this job's ranks, readable by
no other user), named ``disttrain-shm-<job tag>-<creator pid>-<random>``. Its name
reaches the other ranks by a broadcast over the group; once every rank has mapped
it, the creator unlinks the name, so the segment holds no name in /dev/shm while
the ranks use it and the kernel frees it when the last of them exits, however it
exits (``kill -9`` included). Only a crash between creation and that unlink can
leave a name behind: the launcher removes what carries its job tag
(:func:`remove_leftovers`, ``$DISTTRAIN_JOB_TAG``).

The barrier needs no atomic instruction: every rank owns one 32-bit word (its own
cache line) that only it writes: the number of barriers it has entered. A rank
waits until every other word has reached its own count; it spins briefly, then
sleeps in ``futex(FUTEX_WAIT)`` on the word it waits for, and every rank wakes the
sleepers of its own word after writing it (``FUTEX_WAKE``). A word that changes
between the check and the wait makes the wait return at once, so no wake-up is
lost; the wait also times out every 50 ms to check that the peer is alive (its pid
is in the segment) and that ``--timeout`` has not passed. x86-64 and AArch64
Linux have the futex; elsewhere the wait sleeps in growing steps up to 1 ms.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import mmap
import os
import platform
import secrets
import stat
import time
from typing import ClassVar

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.comm.errors import PeerFailure, UsageError
from disttrain.comm.p2p import global_rank
from disttrain.comm.world import group_timeout

__all__ = ["JOB_ENV", "PREFIX", "Segment", "job_tag", "remove_leftovers"]

#: The launcher's tag for its job's segments (set in every worker's environment).
JOB_ENV = "DISTTRAIN_JOB_TAG"
#: Every segment's name starts so (then the job tag).
PREFIX = "disttrain-shm-"
SHM_DIR = "/dev/shm"
_LINE = 64  # one cache line per rank's word: no false sharing between writers
_PAGE = 4096
_NAME_BYTES = 128
_SPINS = 200  # checks before sleeping: a few microseconds when the peer is running
_POLL = 0.05  # seconds a sleep lasts before checking the peer and the deadline
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1


class _Timespec(ctypes.Structure):
    _fields_: ClassVar = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc = ctypes.CDLL(None, use_errno=True) if _SYS_FUTEX is not None else None
_WAIT_FOR = _Timespec(0, int(_POLL * 1e9))


def _clean(tag: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in tag)[:40]


def job_tag() -> str:
    """This job's tag: the launcher's, else torchrun's run id, else this host's "local"."""
    return _clean(os.environ.get(JOB_ENV) or os.environ.get("TORCHELASTIC_RUN_ID") or "local")


def remove_leftovers(tag: str) -> list[str]:
    """Remove the segments of the job tagged ``tag`` that a dead rank left; their names."""
    removed = []
    for path in glob.glob(os.path.join(SHM_DIR, f"{PREFIX}{glob.escape(_clean(tag))}-*")):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            removed.append(os.path.basename(path))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Segment:
    """``slots`` data areas of ``slot_bytes`` each, shared by the ``n`` ranks of a group."""

    def __init__(self, group: ProcessGroup | None, slots: int, slot_bytes: int) -> None:
        self.group = group
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.slot_bytes = -(-slot_bytes // _PAGE) * _PAGE
        self.header = -(-(self.n * _LINE) // _PAGE) * _PAGE
        self.size = self.header + slots * self.slot_bytes
        self.count = 0  # barriers entered
        self.turn = 0  # pieces moved (the users' double buffering)
        timeout = group_timeout()
        self.timeout = timeout.total_seconds() if timeout is not None else 1800.0
        self._map = self._open()
        self._ctl = memoryview(self._map)[: self.header].cast("I")
        self._base = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        self.data = torch.frombuffer(self._map, dtype=torch.uint8, offset=self.header)
        self._ctl[self.rank * _LINE // 4 + 1] = os.getpid()

    def _open(self) -> mmap.mmap:
        """Create (rank 0) or open the segment, check it, map it; unlink once all have it."""
        name = torch.zeros(_NAME_BYTES, dtype=torch.uint8)
        path, fd, failed = "", -1, 0
        if self.rank == 0:
            unique = f"{job_tag()}-{os.getpid()}-{secrets.token_hex(6)}"
            path = os.path.join(SHM_DIR, PREFIX + unique)
            fd = os.open(
                path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
            )
            try:
                os.ftruncate(fd, self.size)
            except OSError:
                os.close(fd)
                os.unlink(path)
                raise
            name[: len(path)] = torch.tensor(list(path.encode()), dtype=torch.uint8)
        dist.broadcast(name, global_rank(self.group, 0), group=self.group)
        mapped: mmap.mmap | None = None
        try:
            if self.rank != 0:
                path = bytes(name.tolist()).rstrip(b"\0").decode()
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
                st = os.fstat(fd)
                if st.st_uid != os.geteuid() or st.st_mode & 0o077 or st.st_size != self.size:
                    raise OSError(f"{path} is not this job's segment")
            self.file_mode = stat.S_IMODE(os.fstat(fd).st_mode)  # 0600: tested
            mapped = mmap.mmap(fd, self.size)
        except OSError:
            failed = 1
        finally:
            if fd >= 0:
                os.close(fd)
        # Every rank learns whether all mapped it; then the name can go.
        flag = torch.tensor([failed], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        if self.rank == 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if int(flag) or mapped is None:
            raise UsageError(
                f"--algorithm shm: the {self.n} ranks of the group could not share a segment "
                f"in {SHM_DIR} (they must run on one host, as one user)"
            )
        return mapped

    def slot(self, i: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """Data area ``i`` seen as ``numel`` elements of ``dtype``."""
        start = i * self.slot_bytes
        return self.data[start : start + self.slot_bytes].view(dtype)[:numel]

    def barrier(self) -> None:
        """Return once every rank of the group has entered as many barriers as this one."""
        self.count = (self.count + 1) & 0xFFFFFFFF
        mine = self.count
        self._ctl[self.rank * _LINE // 4] = mine
        if _libc is not None:
            _libc.syscall(
                _SYS_FUTEX,
                ctypes.c_void_p(self._base + self.rank * _LINE),
                _FUTEX_WAKE,
                0x7FFFFFFF,
                None,
                None,
                0,
            )
        for peer in range(self.n):
            if peer != self.rank:
                self._wait(peer, mine)

    def _wait(self, peer: int, target: int) -> None:
        word = peer * _LINE // 4
        ctl = self._ctl
        for _ in range(_SPINS):  # a peer can be at most one barrier ahead: target or +1
            if (ctl[word] - target) & 0xFFFFFFFF <= 1:
                return
        deadline = time.monotonic() + self.timeout
        pause = 1e-5
        while True:
            seen = ctl[word]
            if (seen - target) & 0xFFFFFFFF <= 1:
                return
            if _libc is not None:
                _libc.syscall(
                    _SYS_FUTEX,
                    ctypes.c_void_p(self._base + peer * _LINE),
                    _FUTEX_WAIT,
                    ctypes.c_uint32(seen),
                    ctypes.byref(_WAIT_FOR),
                    None,
                    0,
                )
            else:
                time.sleep(pause)
                pause = min(2 * pause, 1e-3)
            if (ctl[word] - target) & 0xFFFFFFFF <= 1:
                return
            pid = ctl[word + 1]
            who = global_rank(self.group, peer)
            if pid and not _alive(pid):
                raise PeerFailure(
                    f"rank {who} (pid {pid}) died during a shared-memory collective", who
                )
            if time.monotonic() > deadline:
                raise PeerFailure(
                    f"rank {who} did not reach the shared-memory barrier within "
                    f"--timeout {self.timeout:g} s",
                    who,
                )

    def close(self) -> None:
        """Drop this rank's mapping (the kernel frees the segment when the last rank does)."""
        self._ctl.release()
        del self.data
        with contextlib.suppress(BufferError):
            self._map.close()
