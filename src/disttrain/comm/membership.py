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
2. waits until every member of generation g has done so or is known dead. Liveness is a
   fact, not a deadline: a member whose process (on this host) is gone, or whose
   heartbeat lapsed for longer than ``heartbeat_timeout``, is dropped at once; one that
   is alive (it heartbeats) is waited for: while it is busy (its CPU time, in its
   heartbeat, advances) up to ``timeout`` (``--timeout``) + ``heartbeat_timeout`` s,
   the most the survivors' failures can lie apart; while it is idle, until every
   collective of the failed step has ended (``--timeout`` after the step began, or now
   if later) + ``heartbeat_timeout`` s: a survivor held in one answers by then, so an
   idle one still silent is hung, and is dropped;
3. proposes the members it saw with their steps, and why each other one is dropped
   (``0:2,1:2|2=its heartbeat lapsed 6.1 s ago``), with one ``compare_set`` on
   ``.../member-<g+1>/members``: the first proposal is the decision, every survivor
   reads it back, so all agree. One that answered too late is not in it (a worker
   stopped, SIGSTOP, past the heartbeat timeout and resumed): it raises
   :class:`~disttrain.comm.errors.LeftOut` saying why it was dropped, and stops, lost
   like the others (the new rank 0 ends it on this host meanwhile, if it still can);
4. the members form the new group under ``.../member-<g+1>/group`` (``world.rejoin``).

Live grow (``--max-workers``, :mod:`disttrain.train.grow`) changes the generation the other
way: a joiner takes a number ``join/tickets`` (its launch rank: the launch count + number
- 1) and, once built, sets ``join/ready/<launch rank>``; the group's rank 0, at a step
boundary, writes ``member-<g+1>/grow`` = ``AT|MEMBERS`` (compare_set: one decision) and
``join/admit/<launch rank>`` for each joiner; at AT steps done every member and the joiners
form the group under ``member-<g+1>/grown`` (its own prefix: a shrink of generation g+1
meanwhile meets under ``.../group``, and the joiner's wait then ends at ``--timeout``).

Each worker also leaves ``pid/<launch rank>`` = ``HOST PID START`` at the start: a
survivor need not wait for a worker whose process is gone, and the new rank 0 can end a
lost worker that still runs on its host (one that hung: it would otherwise keep the job
from ending). START, the process's start time, tells that process from a later one given
the same pid (pids are reused: 32768 of them on many Linux hosts).

Heartbeats (:class:`Heartbeat`, torchft's lighthouse idea on the job's own store): a
daemon thread of each worker sets ``beat/<launch rank>`` = ``HOST MONOTONIC COUNT CPU``
(CPU: the process's CPU seconds, all threads) every
:func:`heartbeat_interval` s, whatever its main thread does (a long step, a collective,
a slow answer: it runs beside them). A process stopped by SIGSTOP, or so starved that
the thread cannot run, stops beating; a dead one too, but its process is seen gone
first. On the writer's host the age is ``time.monotonic()`` (CLOCK_MONOTONIC, one clock
for the host) minus the stamp; elsewhere it is how long this reader has seen COUNT
unchanged.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field

import torch.distributed as dist

from disttrain.comm.errors import LeftOut
from disttrain.comm.procstat import ended, start_time

__all__ = [
    "HEARTBEAT_TIMEOUT",
    "Change",
    "Heartbeat",
    "Membership",
    "answer_window",
    "heartbeat_interval",
]

#: ``--heartbeat-timeout``'s default: seconds without a heartbeat before a worker is dropped.
HEARTBEAT_TIMEOUT = 4.0
#: The share of a core a waited-for member must use to count as busy (:meth:`Membership._busy`).
BUSY_CPU = 0.05


def answer_window(timeout: float) -> float:
    """Seconds the launcher's roll call (``launch/rollcall.py``, a job without live shrink)
    waits for the workers' answers: the spread of their failures, at most ``--timeout``.
    Live shrink's agreement no longer uses a window: it goes by heartbeats
    (:meth:`Membership.agree`)."""
    return min(max(timeout, 1.0), 3.0)


def heartbeat_interval(heartbeat_timeout: float) -> float:
    """Seconds between a worker's heartbeats: 0.5, or a quarter of the timeout if shorter
    (a lapse is then four missed beats, not one late one)."""
    return min(0.5, heartbeat_timeout / 4)


class Heartbeat(threading.Thread):
    """Sets ``key`` = ``HOST MONOTONIC COUNT CPU`` in ``store`` every ``interval`` s until
    :meth:`stop` (a daemon thread: it never holds the process up). The first beat is
    written before :meth:`start` returns, so a peer never sees a member without one."""

    def __init__(self, store: dist.Store, key: str, interval: float) -> None:
        super().__init__(name="disttrain-heartbeat", daemon=True)
        self.store: dist.Store | None = store
        self.key, self.interval = key, interval
        self.host = socket.gethostname()
        self.count = 0
        self._stop_event = threading.Event()

    def beat(self) -> bool:
        """One heartbeat; False once the store is gone (the job ended under it)."""
        store = self.store
        if store is None:
            return False
        self.count += 1
        now, cpu = time.monotonic(), time.process_time()  # the whole process's CPU time
        try:
            store.set(self.key, f"{self.host} {now:.3f} {self.count} {cpu:.3f}")
        except Exception:  # the job's store removed at its end: nothing left to tell
            return False
        return True

    def start(self) -> None:
        self.beat()
        super().start()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval) and self.beat():
            pass

    def stop(self) -> None:
        """No more beats (idempotent); the store is let go, so it can close."""
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5)
        self.store = None


@dataclass(frozen=True)
class Change:
    """One membership change: the members before and after, by launch rank, and the steps
    each member had completed."""

    generation: int
    before: tuple[int, ...]
    members: tuple[int, ...]
    done: dict[int, int] = field(default_factory=dict)
    #: this worker waited out its whole wait for some worker (one that heartbeats but
    #: never answered: a hung one)
    waited: bool = False
    #: launch rank -> why it was dropped (the decision's: its process is gone, its
    #: heartbeat lapsed, or it was alive and never answered)
    why: dict[int, str] = field(default_factory=dict)

    @property
    def lost(self) -> list[int]:
        return [r for r in self.before if r not in self.members]


class Membership:
    """This worker's view of who trains: launch ranks, the generation, the agreement."""

    def __init__(
        self,
        store: dist.Store,
        launch_rank: int,
        world_size: int,
        timeout: float,
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
    ):
        self.store = store
        self.me = launch_rank
        self.members: tuple[int, ...] = tuple(range(world_size))
        self.generation = 0
        #: ``--timeout``: how long after a failed step began a live member is waited for
        self.timeout = timeout
        self.heartbeat_timeout = heartbeat_timeout
        self.heartbeat: Heartbeat | None = None
        #: other hosts' beats: launch rank -> (COUNT last read, when it changed)
        self._beats: dict[int, tuple[str, float]] = {}
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

    def start_heartbeat(self) -> Heartbeat:
        """This worker's :class:`Heartbeat` under ``beat/<launch rank>``, running."""
        if self.heartbeat is None:
            interval = heartbeat_interval(self.heartbeat_timeout)
            self.heartbeat = Heartbeat(self.store, self._key(f"beat/{self.me}"), interval)
            self.heartbeat.start()
        return self.heartbeat

    def stop_heartbeat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()

    @property
    def wait_limit(self) -> float:
        """The most seconds a survivor waits for a live member's answer: ``--timeout``, the
        most the survivors' failures can lie apart (a rank slower than that fails its
        peers' collectives anyway), plus the heartbeat timeout for the scheduling of a
        loaded host."""
        return self.timeout + self.heartbeat_timeout

    def _deadline(self, start: float, since: float, busy: bool) -> float:
        """Until when (monotonic) a live member that has not answered is waited for, in an
        agreement begun at ``start`` after a step begun at ``since``. One that is busy (its
        CPU time advances: computing its way here, however starved) for up to
        :attr:`wait_limit`; one that is idle (blocked, or hung) until the failed step's
        collectives have all ended, ``--timeout`` after it began (or now, if later), plus
        the heartbeat timeout: a survivor still held in one answers by then, a hung
        worker never does (Horovod's stall inspector tells a slow rank from a stalled one
        the same way, by what it does)."""
        if busy:
            return start + self.wait_limit
        return max(since + self.timeout, start) + self.heartbeat_timeout

    def _busy(self, r: int, seen: dict[int, list[tuple[float, float]]]) -> bool:
        """True if launch rank ``r``'s process is computing: it used :data:`BUSY_CPU` of a
        core over the last second (half the heartbeat timeout if shorter), by the CPU times
        its heartbeats carried, on the heartbeats' own clock (``seen``: this agreement's
        distinct beats, (its monotonic time, CPU s)). Not the reader's clock: on a loaded
        host beats come late, and a busy member whose CPU figure had not been refreshed
        within the reader's second read as idle (a suite run at load 14). Its heartbeat
        thread alone uses about a thousandth of a core."""
        beat = self._beat(r)
        try:
            when, cpu = (float(beat[1]), float(beat[3])) if beat else (None, None)
        except ValueError:  # a beat of an older format: no CPU figure
            return False
        if when is None or cpu is None:
            return False
        window = min(1.0, self.heartbeat_timeout / 2)
        readings = seen.setdefault(r, [])
        if not readings or readings[-1][0] != when:  # a new beat
            readings.append((when, cpu))
        while len(readings) > 1 and readings[1][0] <= when - window:
            readings.pop(0)  # keep one beat at least ``window`` older than the last
        first, then = readings[0]
        span = when - first
        return span >= window and cpu - then >= BUSY_CPU * span

    def _beat(self, r: int) -> list[str] | None:
        """Launch rank ``r``'s last heartbeat: ``[HOST, MONOTONIC, COUNT, CPU]``, or None."""
        key = self._key(f"beat/{r}")
        if not self.store.check([key]):
            return None
        return [*self.store.get(key).decode().split(" "), "", "", "", ""][:4]

    def silence(self, r: int, since: float | None = None) -> float | None:
        """Seconds since launch rank ``r``'s heartbeat last advanced, as far as this worker
        can tell (module docstring); with no beat from it at all, the seconds since
        ``since`` (monotonic), or None without ``since``."""
        beat = self._beat(r)
        now = time.monotonic()
        if beat is None:
            return None if since is None else now - since
        host, stamp, count, _ = beat
        if host == socket.gethostname():
            try:
                return max(0.0, now - float(stamp))
            except ValueError:
                pass
        last = self._beats.get(r)
        if last is None or last[0] != count:
            self._beats[r] = (count, now)
            return 0.0
        return now - last[1]

    def dead(self, r: int, since: float | None = None) -> str | None:
        """Why launch rank ``r`` is known not to be alive, or None: its process is gone
        (this host), or its heartbeat lapsed for longer than the heartbeat timeout."""
        if self._ended(r):
            return "its process is gone"
        quiet = self.silence(r, since)
        if quiet is None or quiet <= self.heartbeat_timeout:
            return None
        limit = f"over --heartbeat-timeout {self.heartbeat_timeout:g}"
        if not self.store.check([self._key(f"beat/{r}")]):
            return f"no heartbeat from it in {quiet:.1f} s, {limit}"
        return f"its heartbeat lapsed {quiet:.1f} s ago, {limit}"

    def agree(self, done: int = 0, since: float | None = None) -> Change:
        """The next generation's members, as every survivor sees them (module docstring);
        ``done``: the steps this worker completed; ``since`` (monotonic): when the failed
        step began (default: now). How long a live member is waited for: see
        :meth:`_deadline`."""
        gen = self.generation + 1
        alive = self._key(f"member-{gen}/alive")
        self.store.set(f"{alive}/{self.me}", str(done))
        start = time.monotonic()
        since = start if since is None else min(since, start)
        cpu: dict[int, list[tuple[float, float]]] = {}  # (when, CPU s) read of each member
        while True:
            seen = [r for r in self.members if self.store.check([f"{alive}/{r}"])]
            why = {r: self.dead(r, start) for r in self.members if r not in seen}
            waiting = {r: self._busy(r, cpu) for r, dead in why.items() if dead is None}
            now = time.monotonic()
            if all(now >= self._deadline(start, since, busy) for busy in waiting.values()):
                break
            time.sleep(0.05)
        for r, busy in waiting.items():
            why[r] = (
                f"alive and busy but no answer within {self.wait_limit:g} s"
                if busy
                else f"alive but idle, no answer {now - since:.1f} s after the failed "
                "step began (hung)"
            )
        proposal = ",".join(f"{r}:{int(self.store.get(f'{alive}/{r}'))}" for r in seen)
        proposal += "|" + ";".join(f"{r}={text}" for r, text in why.items())
        decided = self.store.compare_set(self._key(f"member-{gen}/members"), "", proposal)
        steps, dropped = _decision(decided.decode())
        members = tuple(sorted(steps))
        change = Change(gen, self.members, members, steps, bool(waiting), dropped)
        if self.me not in members:
            because = dropped.get(self.me, "it answered after the others had agreed")
            raise LeftOut(
                f"dropped from the job at step {done + 1} ({because}): the other workers "
                f"went on as {list(members)} (generation {gen}) and this one does not "
                "come back by itself; a job with --max-workers takes a new worker through "
                "`disttrain train --join OUT`"
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

    def end_await(self) -> None:
        """Rank 0, under the tests' DISTTRAIN_AWAIT_JOIN: its wait for a joiner is over."""
        self.store.set(self._key("join/awaited"), "1")

    def await_ended(self) -> bool:
        return bool(self.store.check([self._key("join/awaited")]))

    def ready_joiners(self, launch_workers: int, room: int) -> list[int]:
        """Rank 0: launch ranks of joiners ready and not yet named (at most ``room``, in
        ticket order; one not yet ready holds those behind it while it is alive, and one
        known dead, :meth:`dead`, is passed over: its ticket is never admitted)."""
        issued = launch_workers + int(self.store.add(self._key("join/tickets"), 0))
        ready: list[int] = []
        for r in range(self.highest + 1, issued):
            if len(ready) == room:
                break
            if self.dead(r) is not None:
                continue
            if not self.store.check([self._key(f"join/ready/{r}")]):
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


def _decision(text: str) -> tuple[dict[int, int], dict[int, str]]:
    """``0:2,1:2|2=why;3=why``: each member's steps done, and why each other one was dropped."""
    listed, _, reasons = text.partition("|")
    steps: dict[int, int] = {}
    for item in listed.split(","):
        rank, _, done = item.partition(":")
        steps[int(rank)] = int(done)
    dropped: dict[int, str] = {}
    for item in filter(None, reasons.split(";")):
        rank, _, why = item.partition("=")
        dropped[int(rank)] = why
    return steps, dropped
