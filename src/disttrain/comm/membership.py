"""Live membership of a synchronous job: the survivors of a lost worker agree on who goes on.

Workers are named by their *launch rank* (the rank they started with, stable for the
whole job); after a change each member's rank in the new group is its position in the
sorted list of members. Generation 0 is the job as launched. When a collective fails,
each survivor drops its group (``world.leave_group``) and, for generation g + 1, in the
job's store (``world.job_store``: the file store of a single-host job, torchrun's
TCPStore otherwise; plain text values, no pickle):

1. sets ``.../member-<g+1>/alive/<launch rank>`` to the number of steps it completed (a
   peer may fail after some survivors finished the step's collectives and others did
   not: the trainer then gives everyone the state of the one furthest on);
2. waits until every member of generation g has done so or is known dead (its process,
   on this host, is gone), or ``window`` seconds: a hung worker never answers, and the
   survivors fail within about one step of each other (each one's collective ends at the
   closed connection, or at ``--timeout``);
3. proposes the members it saw with their steps (``0:2,1:2``), with one ``compare_set`` on
   ``.../member-<g+1>/members``: the first proposal is the decision, every survivor
   reads it back, so all agree. One that answered too late is not in it: it raises
   :class:`~disttrain.comm.errors.LeftOut` and stops, lost like the others;
4. the members form the new group under ``.../member-<g+1>/group`` (``world.rejoin``).

Live grow (``--max-workers``, :mod:`disttrain.train.grow`) changes the generation the other
way: a joiner takes a number ``join/tickets`` (its launch rank: the launch count + number
- 1) and, once built, sets ``join/ready/<launch rank>``; the group's rank 0, at a step
boundary, writes ``member-<g+1>/grow`` = ``AT|MEMBERS`` (compare_set: one decision) and
``join/admit/<launch rank>`` for each joiner; at AT steps done every member and the joiners
form the group under ``member-<g+1>/grown`` (its own prefix: a shrink of generation g+1
meanwhile meets under ``.../group``, and the joiner's wait then ends at ``--timeout``).

Each worker also leaves ``pid/<launch rank>`` = ``HOST PID START`` at the start: a
survivor need not wait the window for a worker whose process is gone, and the new rank 0
can end a lost worker that still runs on its host (one that hung: it would otherwise keep
the job from ending). START, the process's start time, tells that process from a later
one given the same pid (pids are reused: 32768 of them on many Linux hosts).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass, field

import torch.distributed as dist

from disttrain.comm.errors import LeftOut
from disttrain.comm.procstat import ended, start_time

__all__ = ["Change", "Membership", "answer_window"]


def answer_window(timeout: float) -> float:
    """Seconds the survivors wait for each other's answers: the spread of their failures,
    at most ``--timeout``. Survivors leave each step's last collective together and wait
    on the same peer, so they fail within one step of each other; 3 s cover a loaded host
    and keep a hang's cost (``--timeout`` + window + regroup) under ``--timeout`` + 5."""
    return min(max(timeout, 1.0), 3.0)


@dataclass(frozen=True)
class Change:
    """One membership change: the members before and after, by launch rank, and the steps
    each member had completed."""

    generation: int
    before: tuple[int, ...]
    members: tuple[int, ...]
    done: dict[int, int] = field(default_factory=dict)
    #: this worker waited out the answer window for some worker (one neither answering
    #: nor seen gone from this host: a hung one, or one on another host)
    waited: bool = False

    @property
    def lost(self) -> list[int]:
        return [r for r in self.before if r not in self.members]


class Membership:
    """This worker's view of who trains: launch ranks, the generation, the agreement."""

    def __init__(self, store: dist.Store, launch_rank: int, world_size: int, window: float):
        self.store = store
        self.me = launch_rank
        self.members: tuple[int, ...] = tuple(range(world_size))
        self.generation = 0
        self.window = window
        #: the highest launch rank any decision named (live grow: tickets above are new)
        self.highest = world_size - 1
        # an elastic restart round (--max-restarts, torchrun) starts its own generations
        self._root = f"disttrain/round-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"

    def _key(self, name: str) -> str:
        return f"{self._root}/{name}"

    @property
    def rank(self) -> int:
        """This worker's rank in the current group."""
        return self.members.index(self.me)

    def group_prefix(self) -> str:
        """Where the current generation's process group meets in the store."""
        return self._key(f"member-{self.generation}/group")

    def publish_pid(self) -> None:
        """Leave ``HOST PID START`` of this process, for :meth:`end_lost`."""
        me = os.getpid()
        self.store.set(self._key(f"pid/{self.me}"), f"{socket.gethostname()} {me} {start_time(me)}")

    def agree(self, done: int = 0) -> Change:
        """The next generation's members, as every survivor sees them (module docstring);
        ``done``: the steps this worker completed."""
        gen = self.generation + 1
        alive = self._key(f"member-{gen}/alive")
        self.store.set(f"{alive}/{self.me}", str(done))
        deadline = time.monotonic() + self.window
        while True:
            seen = [r for r in self.members if self.store.check([f"{alive}/{r}"])]
            waiting = [r for r in self.members if r not in seen and not self._ended(r)]
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        waited = bool(waiting)
        proposal = ",".join(f"{r}:{int(self.store.get(f'{alive}/{r}'))}" for r in seen)
        decided = self.store.compare_set(self._key(f"member-{gen}/members"), "", proposal)
        steps: dict[int, int] = {}
        for item in decided.decode().split(","):
            r, _, d = item.partition(":")
            steps[int(r)] = int(d)
        members = tuple(sorted(steps))
        change = Change(gen, self.members, members, steps, waited)
        if self.me not in members:
            raise LeftOut(
                f"left out of the job: the other workers agreed on {list(members)} before "
                f"this one answered (generation {gen})"
            )
        self.members, self.generation = members, gen
        return change

    def _local(self, r: int) -> tuple[int, str] | None:
        """(pid, start time) of launch rank ``r``'s process if it ran on this host."""
        key = self._key(f"pid/{r}")
        if not self.store.check([key]):
            return None
        host, pid, start = [*self.store.get(key).decode().split(" "), "", ""][:3]
        return (int(pid), start) if host == socket.gethostname() and pid.isdigit() else None

    def _ended(self, r: int) -> bool:
        """True if launch rank ``r``'s process ran on this host and is gone: no such pid, a
        zombie (killed, not yet reaped by its supervisor), or a later process with its pid."""
        known = self._local(r)
        if known is None:
            return False
        return ended(*known)

    def end_lost(self, lost: list[int]) -> list[int]:
        """SIGKILL the lost workers that still run on this host (a hung one); those ended."""
        ended = []
        for r in lost:
            known = self._local(r)
            if known is None:
                continue
            try:  # a pidfd names the process it found: a pid reused after the check is safe
                fd = os.pidfd_open(known[0])
            except OSError:
                continue
            try:
                if not self._ended(r):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                    ended.append(r)
            except OSError:
                pass
            finally:
                os.close(fd)
        return ended

    # --- live grow (train/grow.py) ------------------------------------------------------

    def take_ticket(self, launch_workers: int) -> int:
        """A joiner's launch rank: the job's launch count + its number among joiners - 1."""
        return launch_workers + int(self.store.add(self._key("join/tickets"), 1)) - 1

    def set_ready(self) -> None:
        """A joiner is built and waits to be admitted."""
        self.store.set(self._key(f"join/ready/{self.me}"), "1")

    def ready_joiners(self, launch_workers: int, room: int) -> list[int]:
        """Rank 0: launch ranks of joiners ready and not yet named (at most ``room``, in
        ticket order; one not yet ready holds those behind it)."""
        issued = launch_workers + int(self.store.add(self._key("join/tickets"), 0))
        ready: list[int] = []
        for r in range(self.highest + 1, issued):
            if len(ready) == room or not self.store.check([self._key(f"join/ready/{r}")]):
                break
            ready.append(r)
        return ready

    def propose_grow(self, at: int, joiners: list[int]) -> None:
        """Rank 0: the members after ``at`` steps are these and ``joiners``; tell each."""
        gen = self.generation + 1
        value = f"{at}|{','.join(map(str, sorted((*self.members, *joiners))))}"
        decided = self.store.compare_set(self._key(f"member-{gen}/grow"), "", value).decode()
        for r in joiners:
            if f",{r}," in f",{decided.partition('|')[2]},":
                self.store.set(self._key(f"join/admit/{r}"), f"{gen}|{decided}")

    def grow_decision(self) -> tuple[int, tuple[int, ...]] | None:
        """(steps done at the grow, the members after it) if rank 0 decided one."""
        key = self._key(f"member-{self.generation + 1}/grow")
        if not self.store.check([key]):
            return None
        at, _, csv = self.store.get(key).decode().partition("|")
        members = tuple(int(r) for r in csv.split(","))
        self.highest = max(self.highest, *members)  # named: never admitted again
        return int(at), members

    def admission(self) -> tuple[int, int, tuple[int, ...]] | None:
        """A joiner: (generation, steps done at the grow, members) once admitted."""
        key = self._key(f"join/admit/{self.me}")
        if not self.store.check([key]):
            return None
        gen, at, csv = self.store.get(key).decode().split("|")
        return int(gen), int(at), tuple(int(r) for r in csv.split(","))

    def adopt(self, generation: int, members: tuple[int, ...]) -> None:
        """Go to ``generation`` with ``members`` (a grow every member saw decided)."""
        self.generation, self.members = generation, members
        self.highest = max(self.highest, *members)

    def grow_prefix(self) -> str:
        """Where a grown generation's group meets (not shrink's ``group``: module docstring)."""
        return self._key(f"member-{self.generation}/grown")

    def close(self, why: str) -> None:
        """Rank 0 at the end: joiners still waiting stop with ``why``."""
        self.store.set(self._key("join/closed"), why)

    def closed(self) -> str | None:
        key = self._key("join/closed")
        return self.store.get(key).decode() if self.store.check([key]) else None
