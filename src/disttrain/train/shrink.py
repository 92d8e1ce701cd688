"""Live shrink (``--min-workers K``): the survivors of a lost worker go on, without a restart.

When a collective of a training step fails because a peer died (gloo: the connection
closed) or hung (no answer within ``--timeout``), every survivor, in :meth:`Shrink.recover`:

1. drops its process group (``comm.world.leave_group``);
2. agrees with the others on who is left, through the job's store
   (:mod:`disttrain.comm.membership`): a peer whose process is gone or whose heartbeat
   lapsed (``--heartbeat-timeout``) is dropped at once, a live one is waited for (a busy
   one up to ``--timeout`` plus the heartbeat timeout, an idle one until the failed
   step's collectives have ended, plus the heartbeat timeout: one still silent is hung);
3. with fewer than K left, raises :class:`~disttrain.comm.errors.TooFewWorkers` naming the
   lost ranks: the job ends, exit code 1, as it would without ``--min-workers``;
4. otherwise forms the new group (ranks renumbered in launch order), lets the strategy
   rebuild what depends on the group (``Regroups.regroup``: the reducer's buckets), ends a
   lost worker still running on this host (one that hung), and the trainer re-cuts the
   sampler for the new count and runs the interrupted step again.

Why the step can be run again from memory: in synchronous data parallelism every replica
holds the same parameters and optimizer state, and all of a step's collectives come before
its optimizer step, so a failed step changed nothing but the gradients, which the second
run computes anew on the survivors' shards of the same global batch. A peer that dies
while the step's last allreduce is on the wire may let some survivors finish it (their sum
had every contribution) and not others: the survivors then take the state of one that
got furthest (:func:`even_out`) and go on from its step. ``--batch-size``
stays the global batch (each of n workers takes B/n), so the steps after a change are
those of the same run on fewer workers: pre-flight (:func:`check`) asks that B split
evenly over every count from K to the launch count. A loss that shows up outside a step
(at a checkpoint's barrier, in the gathers after the last step) ends the job as before.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

import torch
from torch import nn

from disttrain import strategies, timeline
from disttrain.amp import LossScaler
from disttrain.comm import world as world_mod
from disttrain.comm.errors import TooFewWorkers, UsageError, gist, is_peer_error
from disttrain.comm.membership import Change, Membership
from disttrain.config import RunConfig, TrainConfig
from disttrain.dataparallel.broadcast import (
    broadcast_json,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from disttrain.strategies.capabilities import Regroups

__all__ = [
    "ANSWER_DELAY_ENV",
    "Shrink",
    "check",
    "check_batch_splits",
    "check_membership_flag",
    "even_out",
    "membership_for",
]


#: Tests: ``RANK:SECONDS``: launch rank RANK answers the survivors' agreement SECONDS late
#: (its heartbeat goes on meanwhile: a slow survivor, not a dead one).
ANSWER_DELAY_ENV = "DISTTRAIN_ANSWER_DELAY"


def check_membership_flag(tc: TrainConfig, given: str, trait: type, does: str, host: str) -> None:
    """What live shrink and live grow both refuse (exit 2): a strategy without the capability
    ``trait`` (:class:`Regroups`, :class:`Grows`), ``--max-restarts``, more than one host
    (``host``: why one host is needed). ``given`` is the flag as the user gave it."""
    if not issubclass(strategies.get(tc.strategy).runtime, trait):
        kinds = strategies.STRATEGIES.items()
        able = sorted(name for name, kind in kinds if issubclass(kind.runtime, trait))
        raise UsageError(
            f"{given}: only --strategy {' or '.join(able)} {does} "
            f"(this run: --strategy {tc.strategy})"
        )
    if tc.max_restarts:
        raise UsageError(f"{given} with --max-restarts: choose one (not combined yet)")
    if tc.nnodes > 1 or tc.launcher != "local":
        raise UsageError(f"{given} needs a single-host job (--launcher local, --nnodes 1): {host}")


def check_membership_algorithm(cfg: RunConfig, given: str) -> None:
    """Refuse an algorithm whose state is set up for one membership (exit 2): ``shm``'s
    shared-memory segment, and ``hierarchical``, which sums through it inside each host.
    A joiner hung at shm's barrier (2026-11-28); auto's launcher takes ``*:native`` here."""
    from disttrain import collectives

    if "algorithm" not in strategies.get(cfg.train.strategy).settings.reads(cfg):
        return
    for name in collectives.runs(cfg.train.algorithm, cfg):  # auto: a table given by hand
        kind = collectives.ALGORITHMS.get(name)
        if kind.one_host or kind.follows_hosts:
            raise UsageError(
                f"{given} with {name}: its shared-memory segment is set up for one membership "
                "(a joiner hung at its barrier); use --algorithm native or ring"
            )


def check(cfg: RunConfig) -> None:
    """Pre-flight: refuse ``--min-workers`` where live shrink cannot run (exit 2)."""
    tc = cfg.train
    if not tc.live_shrink:
        return
    given = f"--min-workers {tc.min_workers}"
    check_membership_flag(
        tc,
        given,
        Regroups,
        "goes on without a lost worker",
        "the survivors end a hung worker by its process id",
    )
    check_membership_algorithm(cfg, given)
    check_batch_splits(tc.batch_size, (tc.min_workers, given), (tc.world_size, str(tc.world_size)))


def check_batch_splits(batch: int, low: tuple[int, str], high: tuple[int, str]) -> None:
    """Refuse (exit 2) a global ``--batch-size`` that some worker count from ``low`` to
    ``high`` (each: the count, and how the message names it) does not divide: the job may
    run at any of them, each worker taking B/n."""
    counts = range(low[0], high[0] + 1)
    uneven = [n for n in counts if batch % n]
    if uneven:
        raise UsageError(
            f"--batch-size {batch} must split evenly over every worker count from "
            f"{low[1]} to {high[1]} (not over {', '.join(map(str, uneven))}): use a "
            f"multiple of {math.lcm(*counts)}"
        )


def even_out(
    change: Change,
    members: Membership,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: LossScaler | None,
    line: dict[str, Any] | None = None,
) -> tuple[int, dict[str, Any] | None]:
    """The steps every survivor has completed once each holds the state of the lowest launch
    rank among those that completed the most (broadcast in the new group when they differ:
    model, optimizer, fp16 loss scaler), and that survivor's ``line`` (its last
    metrics.jsonl step line: the step it ran alone may be missing from the file) or None
    when all had completed the same steps."""
    target = max(change.done.values())
    if all(d == target for d in change.done.values()):
        return target, None
    source = members.members.index(min(r for r, d in change.done.items() if d == target))
    broadcast_parameters(model.state_dict(), source)
    broadcast_optimizer_state(optimizer, source)
    if scaler is not None:
        scaler.load_state_dict(broadcast_json(scaler.state_dict(), source))
    return target, broadcast_json(line or {}, source) or None


def membership_for(tc: TrainConfig, world: world_mod.World) -> Membership | None:
    """This worker's membership when the job may change (``--min-workers``, ``--max-workers``:
    live shrink and grow share it), else None."""
    if not (tc.live_shrink or tc.live_grow):
        return None
    if world.nodes > 1:  # torchrun across hosts: pre-flight did not see the job
        raise UsageError("--min-workers and --max-workers need a single-host job")
    members = Membership(
        world_mod.job_store(), world.rank, world.world_size, tc.timeout, tc.heartbeat_timeout
    )
    members.publish_pid()
    start_heartbeat(members)
    return members


def start_heartbeat(members: Membership) -> None:
    """Start ``members``' heartbeat thread, stopped when the process leaves its group
    (``world.shutdown``), before the job's store can go: a beat after the end would
    write the store's file again."""
    beat = members.start_heartbeat()
    world_mod.at_shutdown(beat.stop)


class Shrink:
    """One worker's side of live shrink: its membership, and the changes it went through."""

    def __init__(self, tc: TrainConfig, membership: Membership, changes: list[Any]) -> None:
        self.min_workers = tc.min_workers
        self.membership = membership
        #: summary.json's ``membership``: one entry per change (shared with live grow)
        self.changes: list[dict[str, Any]] = changes
        #: after :meth:`recover`: the metrics.jsonl line of the survivor whose state all took
        self.caught_up: dict[str, Any] | None = None

    def take_caught_up(self) -> dict[str, Any] | None:
        """:attr:`caught_up`, once (cleared: a later change, a grow's, has its own)."""
        line, self.caught_up = self.caught_up, None
        return line

    def recover(
        self,
        exc: BaseException,
        step: int,
        strategy: strategies.Strategy,
        began: float,
        scaler: LossScaler | None = None,
        line: dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """After ``exc`` in step ``step`` (begun at ``began``, perf_counter): the change once
        the survivors have regrouped, its ``step`` the one to run next (``step`` again, or
        the next if another survivor had finished it); None if ``exc`` is no peer's.
        ``line``: this worker's last metrics.jsonl step line; :attr:`caught_up` is then the
        line of the survivor whose state all took (None if they were at the same step)."""
        self.caught_up = None
        if not is_peer_error(exc):
            return None
        why = gist(exc)
        before = self.membership.members
        assert isinstance(strategy, Regroups)  # pre-flight refused --min-workers otherwise
        strategy.abandon_step()  # nothing of the step may still use the group it drops
        since = time.monotonic() - (time.perf_counter() - began)  # the step's start
        world, change, why = self._form_group(step, before, why, since)
        lost = [r for r in before if r not in change.members]
        strategy.regroup(world)
        done, self.caught_up = even_out(
            change, self.membership, strategy.model, strategy.optimizer, scaler, line
        )
        go_on = done + 1
        if world.rank == 0:
            self.membership.end_lost(lost)  # a hung one would keep the job from ending
            how = f"run step {step} again" if go_on == step else f"go on from step {go_on}"
            sys.stderr.write(
                f"disttrain: rank(s) {', '.join(map(str, lost)) or 'none'} lost at step {step} "
                f"({why}): {len(change.members)} of {len(before)} workers {how} "
                f"(--min-workers {self.min_workers})\n"
            )
            sys.stderr.flush()
        record = {
            "step": go_on,
            "workers": len(change.members),
            "before": len(before),
            "lost": lost,
            "seconds_lost": round(time.perf_counter() - began, 3),
            "waited_out_window": change.waited,
            "why": {str(r): change.why.get(r, "") for r in lost},
        }
        timeline.instant("membership change", lane="comm", **record)  # --timeline shows it
        self.changes.append(record)
        return record

    def _form_group(
        self, step: int, before: tuple[int, ...], why: str, since: float
    ) -> tuple[world_mod.World, Change, str]:
        """Agree on the survivors and form their group, again while another worker is lost
        meanwhile; the new world, the agreed change and the latest cause. ``since``
        (monotonic): when the failed step began, or the failure after it (an idle member
        is waited for until its collectives can have ended). Fewer than ``--min-workers``
        survivors: :class:`TooFewWorkers` naming the lost ranks and why each was dropped."""
        while True:
            world_mod.leave_group()
            _delay_answer(self.membership.me)
            change = self.membership.agree(done=step - 1, since=since)
            lost = [r for r in before if r not in change.members]
            left = len(change.members)
            if left < self.min_workers:
                dropped = "; ".join(f"{r}: {change.why[r]}" for r in lost if r in change.why)
                raise TooFewWorkers(
                    f"lost rank(s) {', '.join(map(str, lost))} at step {step} ({why}): "
                    f"{left} worker(s) left, fewer than --min-workers {self.min_workers}"
                    + (f" [{dropped}]" if dropped else ""),
                    lost,
                )
            try:
                group = self.membership.group_prefix()
                return world_mod.rejoin(self.membership.rank, left, group), change, why
            except Exception as again:  # another worker lost while forming the group
                if not is_peer_error(again):
                    raise
                why, since = gist(again), time.monotonic()


def _delay_answer(launch_rank: int) -> None:
    """Tests (:data:`ANSWER_DELAY_ENV`): this worker answers late, heartbeating."""
    rank, _, seconds = os.environ.get(ANSWER_DELAY_ENV, "").partition(":")
    if rank.isdigit() and int(rank) == launch_rank:
        time.sleep(float(seconds))
