"""Live grow (``--max-workers M``): a worker started with ``disttrain train --join OUT`` joins
the running job at a step boundary, with the state of a live peer, not from disk.

The job (``--strategy allreduce --workers N --max-workers M``) leaves a *join point*,
``OUT/join.json``: its store's file, its settings and its run (rank 0 writes it at the start
and removes it at the end). A joiner (:class:`Joiner`):

1. reads it, opens the job's store, takes a ticket (its launch rank, after every launch
   rank of the job: :mod:`disttrain.comm.membership`), and builds its model, optimizer and
   data in a group of its own (one process: the strategy's ``setup`` exchanges nothing);
2. starts its heartbeat (:class:`~disttrain.comm.membership.Heartbeat`), says it is
   ready, and waits (at most ``--timeout`` s, the job's) to be admitted. Rank 0 passes
   over a ticket whose process is gone or whose heartbeat lapsed (``--heartbeat-timeout``):
   a joiner that died while building holds no live joiner behind it.

The running workers (:class:`Grow`) look at the store at every step boundary (rank 0 one
``add`` and one ``check``, the others one ``check``). Rank 0, seeing a ready joiner after
``s`` steps, decides the grow for ``s + 1`` steps done: every other worker passes that
boundary only after rank 0's contribution to step s + 1, so after the decision, and sees
it there. At that boundary every member commits a pending checkpoint, drops its group, and
all (members and joiners) form the new group, ranks in launch order (joiners last); the
strategy rebuilds what depends on the group (``Regroups.regroup``, as after a shrink), and
group rank 0 broadcasts the model (parameters and buffers), the optimizer state, the fp16
loss scaler, the steps done and its RNG state (:func:`share_state`: tensors and JSON, no
pickle). The trainer re-cuts the sampler for the new count (``--batch-size`` stays the
global batch) and every worker goes on from the next step: none is lost or repeated.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from disttrain import strategies, timeline
from disttrain.amp import LossScaler
from disttrain.comm import world as world_mod
from disttrain.comm.errors import DisttrainError, PeerFailure, UsageError, gist, is_peer_error
from disttrain.comm.membership import Membership
from disttrain.config import RunConfig, TrainConfig
from disttrain.dataparallel.broadcast import (
    broadcast_json,
    broadcast_optimizer_state,
    broadcast_parameters,
    broadcast_tensors,
)
from disttrain.strategies.capabilities import Grows
from disttrain.train.shrink import (
    check_batch_splits,
    check_membership_algorithm,
    check_membership_flag,
    start_heartbeat,
)

__all__ = ["DUMP_ENV", "JOIN_POINT", "Grow", "JoinFailed", "Joiner", "check", "share_state"]

#: The file in ``--out`` that tells a joiner where the job meets.
JOIN_POINT = "join.json"
#: Debugging (and the tests): each worker writes the sha256 of its model and optimizer
#: state right after a grow's broadcast to ``$DISTTRAIN_JOIN_DUMP/<launch rank>``.
DUMP_ENV = "DISTTRAIN_JOIN_DUMP"
#: Tests: rank 0 admits no joiner before this many steps done, and there every member waits
#: for one to be ready (at most ``AWAIT_LIMIT``), so that the grow happens at a known step.
AWAIT_ENV = "DISTTRAIN_AWAIT_JOIN"
#: The most seconds that wait lasts. What it waits for is a joiner's start-up, which a loaded
#: machine stretches past a short ``--timeout``; the members wait outside any collective, so
#: ``--timeout`` (the collectives' limit, and the wait for an admitted joiner) need not cover it.
AWAIT_LIMIT = 120.0

#: Tests: a joiner that exits at once after its admission (the members go on without it).
FAIL_ENV = "DISTTRAIN_JOIN_FAIL"


class JoinFailed(DisttrainError):
    """A joiner could not join: what it waited for, and for how long."""


def check(cfg: RunConfig) -> None:
    """Pre-flight: refuse ``--max-workers`` where live grow cannot run (exit 2)."""
    tc = cfg.train
    if not tc.live_grow:
        return
    given = f"--max-workers {tc.max_workers}"
    check_membership_flag(
        tc, given, Grows, "admits a joining worker", "joiners meet the job in its file store"
    )
    check_membership_algorithm(cfg, given)
    low = tc.min_workers if tc.live_shrink else tc.world_size
    check_batch_splits(tc.batch_size, (low, str(low)), (tc.max_workers, given))


def share_state(
    strategy: strategies.Strategy, scaler: LossScaler | None, done: int, launch_rank: int
) -> int:
    """Every worker of the new group gets group rank 0's state; returns rank 0's steps done.

    Rank 0 is a member from before (joiners come last in launch order). The RNG state
    travels too, so a joiner's dropout draws go on as rank 0's."""
    broadcast_parameters(strategy.model.state_dict(), 0)
    broadcast_optimizer_state(strategy.optimizer, 0)
    head = broadcast_json({"step": done, "scaler": scaler.state_dict() if scaler else {}}, 0)
    if scaler is not None:
        scaler.load_state_dict(head["scaler"])
    rng = torch.get_rng_state()
    broadcast_tensors([rng], 0)
    torch.set_rng_state(rng)
    folder = os.environ.get(DUMP_ENV)
    if folder:
        _dump(strategy, os.path.join(folder, str(launch_rank)), int(head["step"]))
    return int(head["step"])


def _dump(strategy: strategies.Strategy, path: str, done: int) -> None:
    """``STEPS SHA256``: of the model's and the optimizer's tensors, bytes in order."""
    digest = hashlib.sha256()
    tensors = list(strategy.model.state_dict().values())
    for entry in strategy.optimizer.state_dict()["state"].values():
        tensors += [v for _, v in sorted(entry.items()) if torch.is_tensor(v)]
    for t in tensors:
        digest.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    with open(path, "w") as fh:
        fh.write(f"{done} {digest.hexdigest()}\n")


class Grow:
    """A member's side of live grow: watch for joiners, admit them at a step boundary."""

    def __init__(
        self, tc: TrainConfig, membership: Membership, changes: list[dict[str, Any]]
    ) -> None:
        self.membership, self.changes = membership, changes
        self.max_workers, self.launch_workers = tc.max_workers, tc.world_size
        self.pending: tuple[int, tuple[int, ...]] | None = None
        self.hold_at = int(os.environ.get(AWAIT_ENV, "-1"))
        self.point = os.path.join(tc.out, JOIN_POINT) if tc.out else ""

    def open(self, cfg: RunConfig, run_id: str) -> None:
        """Launch rank 0: leave the join point in ``--out`` (written whole, then renamed)."""
        from disttrain import config

        if not self.point:
            return
        point = {
            "store": world_mod.job_store_path(),
            "run": run_id,
            "workers": self.launch_workers,
            "settings": config.changed_settings(cfg),
        }
        with open(self.point + ".tmp", "w") as fh:
            json.dump(point, fh)
        os.replace(self.point + ".tmp", self.point)

    def close(self, step: int) -> None:
        """The group's rank 0 at the end: joiners still waiting stop; no join point left."""
        self.membership.close(f"the job ended after step {step}")
        if self.point and os.path.exists(self.point):
            os.remove(self.point)

    def due(self, done: int, step_limit: int) -> bool:
        """At the boundary after ``done`` steps: True if joiners come in here."""
        m = self.membership
        if self.pending is None:
            room = self.max_workers - len(m.members)
            open_ = room > 0 and done + 1 < step_limit
            # (tests: none admitted before hold_at steps, and there the wait for one)
            if open_ and done == self.hold_at:
                self._await_joiner()
            if m.rank == 0 and open_ and done >= self.hold_at:
                joiners = m.ready_joiners(self.launch_workers, room)
                if joiners:
                    m.propose_grow(done + 1, joiners)
            self.pending = m.grow_decision()
        return self.pending is not None and self.pending[0] == done

    def _await_joiner(self) -> None:
        """The test hook's wait (AWAIT_ENV), every member at this boundary: rank 0 for a
        ready joiner, the others for rank 0 to end its wait. None is inside a collective
        (whose --timeout would end a peer's wait first), so AWAIT_LIMIT bounds it."""
        m, deadline = self.membership, time.monotonic() + AWAIT_LIMIT
        if m.rank == 0:
            while not m.ready_joiners(self.launch_workers, 1) and time.monotonic() < deadline:
                time.sleep(0.05)
            m.end_await()
            return
        while not m.await_ended() and time.monotonic() < deadline + 5:
            time.sleep(0.05)

    def admit(
        self, done: int, strategy: strategies.Strategy, scaler: LossScaler | None
    ) -> dict[str, Any]:
        """Form the grown group and share the state; the record of the change."""
        began = time.perf_counter()
        assert self.pending is not None
        (_, members), self.pending = self.pending, None
        m, before = self.membership, self.membership.members
        world_mod.leave_group()
        m.adopt(m.generation + 1, members)
        try:
            world = world_mod.rejoin(m.rank, len(members), m.grow_prefix())
        except Exception as exc:  # a joiner gone between its admission and the group
            if not is_peer_error(exc):
                raise
            world = self._without_joiners(before, done, gist(exc))
        assert isinstance(strategy, Grows)  # pre-flight refused --max-workers otherwise
        strategy.regroup(world)
        share_state(strategy, scaler, done, m.me)
        joined = [r for r in m.members if r not in before]
        if world.rank == 0 and joined:
            sys.stderr.write(
                f"disttrain: rank(s) {', '.join(map(str, joined))} joined after step {done}: "
                f"{len(m.members)} workers go on (--max-workers {self.max_workers})\n"
            )
        record = self.record(done, len(before), joined, time.perf_counter() - began)
        if not joined:  # the admitted joiners never came
            record["not_joined"] = [r for r in members if r not in before]
        return record

    def _without_joiners(self, before: tuple[int, ...], done: int, why: str) -> world_mod.World:
        """The members go on as they were, in a group of the next generation (shrink's
        agreement: a joiner that is gone or stopped beating is not waited for, a live one
        until --timeout)."""
        m = self.membership
        world_mod.leave_group()
        change = m.agree(done)
        if set(change.members) != set(before):
            raise PeerFailure(
                f"the workers changed while admitting rank(s) {', '.join(map(str, change.lost))}"
                f" after step {done} ({why}): now {list(change.members)}"
            )
        world = world_mod.rejoin(m.rank, len(change.members), m.group_prefix())
        if world.rank == 0:
            sys.stderr.write(
                f"disttrain: rank(s) {', '.join(map(str, change.lost))} admitted after step "
                f"{done} did not join ({why}): {len(before)} workers go on\n"
            )
        return world

    def record(self, done: int, before: int, joined: list[int], seconds: float) -> dict[str, Any]:
        record = {
            "step": done + 1,
            "workers": len(self.membership.members),
            "before": before,
            "joined": joined,
            "seconds_lost": round(seconds, 3),
        }
        timeline.instant("membership change", lane="comm", **record)  # --timeline shows it
        self.changes.append(record)
        return record


class Joiner:
    """``disttrain train --join OUT``: this process's way into the running job."""

    def __init__(self, tc: TrainConfig, point: dict[str, Any]) -> None:
        self.timeout, self.out = tc.timeout, tc.join
        store = dist.FileStore(point["store"], -1)  # -1: this process never removes it
        launch_rank = Membership(store, 0, 0, 0).take_ticket(int(point["workers"]))
        self.membership = Membership(store, launch_rank, 0, tc.timeout, tc.heartbeat_timeout)
        self.membership.publish_pid()
        start_heartbeat(self.membership)  # before it is ready: rank 0 passes over a dead one
        self.store = store

    @property
    def launch_rank(self) -> int:
        return self.membership.me

    def join(self, grow: Grow, strategy: strategies.Strategy, scaler: LossScaler | None) -> int:
        """Wait to be admitted, form the group with the job, take its state; the steps done."""
        m = self.membership
        m.set_ready()
        deadline = time.monotonic() + self.timeout
        while (admitted := m.admission()) is None:
            ended = m.closed()
            if ended or time.monotonic() > deadline:
                raise JoinFailed(
                    f"--join {self.out}: not admitted ({ended or 'no answer'}): waited "
                    f"{self.timeout:g} s (--timeout) for the job's rank 0 to admit launch "
                    f"rank {m.me}"
                )
            time.sleep(0.05)
        began = time.perf_counter()
        generation, at, members = admitted
        if os.environ.get(FAIL_ENV):  # tests: gone between admission and the group
            os._exit(1)
        world_mod.leave_group()  # its group of one
        world_mod.adopt_store(self.store)
        m.adopt(generation, members)
        try:
            world = world_mod.rejoin(m.rank, len(members), m.grow_prefix())
        except Exception as exc:  # a member lost meanwhile: the others shrank instead
            raise JoinFailed(
                f"--join {self.out}: the job did not form the group of generation "
                f"{generation} within --timeout {self.timeout:g} s ({exc})"
            ) from exc
        assert isinstance(strategy, Grows)  # pre-flight refused --max-workers otherwise
        strategy.regroup(world)
        done = share_state(strategy, scaler, at, m.me)
        before = [r for r in members if r != m.me]
        grow.record(done, len(before), [m.me], time.perf_counter() - began)
        return done


def read_point(out: str) -> dict[str, Any]:
    """The join point of the job running in ``out``; UsageError if there is none."""
    path = os.path.join(out, JOIN_POINT)
    if not os.path.exists(path):
        raise UsageError(
            f"--join {out}: no job there admits workers (no {JOIN_POINT}: start it with "
            "--max-workers N, and --out this folder)"
        )
    with open(path) as fh:
        point: dict[str, Any] = json.load(fh)
    if not point.get("store") or not os.path.exists(point["store"]):
        raise UsageError(f"--join {out}: the job that wrote {path} is not running any more")
    return point
