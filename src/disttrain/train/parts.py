"""What one process's run is made of, before its loop (train/trainer.py) starts: the
world, the run's id, the data, the model, its optimizer and the strategy (``setup``);
the budget, outputs, step runner, schedule, checkpoints and membership (``prepare``)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from disttrain import checkpoint, timeline
from disttrain.comm import world as world_mod
from disttrain.comm.meter import meter
from disttrain.config import RunConfig
from disttrain.data import GlobalBatchSampler, load_dataset
from disttrain.data.sampler import run_steps
from disttrain.models import build_model
from disttrain.strategies.capabilities import data_shard
from disttrain.train.compiled import graphs
from disttrain.train.engine import Engine, Given
from disttrain.train.faults import parse_fault
from disttrain.train.grow import Grow, Joiner, read_point
from disttrain.train.metrics import Throughput
from disttrain.train.outputs import Outputs
from disttrain.train.pinning import pin_to_cpu
from disttrain.train.resume import agree_run, goes_on
from disttrain.train.saver import Checkpoints, recorded_settings
from disttrain.train.schedules import LRSchedule
from disttrain.train.shrink import Shrink, membership_for
from disttrain.train.trackers import Tracker
from disttrain.train.workload import Workload

__all__ = ["Change", "RunParts"]

Change = dict[str, Any]  # a membership change (train/shrink.py, train/grow.py)


class RunParts:
    """What one process's run is made of: built by :meth:`setup` (world, data, model,
    strategy) and :meth:`prepare` (the loop's parts); :class:`~disttrain.train.trainer.Run`
    is the loop over them."""

    def __init__(self, cfg: RunConfig, trackers: Sequence[Tracker] = ()) -> None:
        self.cfg, self.tc, self.given_trackers = cfg, cfg.train, list(trackers)
        self.epochs_done, self.loss = 0, float("nan")
        self.whole: nn.Module | None = None  # the whole model, evaluated on rank 0
        self.test_loss: float = float("nan")
        self.test_acc: float | None = None  # None for language models
        self.memory: dict[str, int] = {}  # what this worker holds at the end of a step

    def setup(self) -> None:
        """The world, the run's id, the data, the model, its optimizer and the strategy."""
        tc = self.tc
        self.world = world_mod.init(
            device=tc.device, timeout=tc.timeout, threads=tc.threads, backend=tc.backend
        )
        # --join: this process builds in a group of its own, then joins the job (train/grow.py)
        self.joiner = Joiner(tc, read_point(tc.join)) if tc.join else None
        joiner = self.joiner
        self.run_id = (
            os.environ.get(checkpoint.RUN_ENV, "") if joiner else agree_run(tc, self.world)
        )
        first = joiner.launch_rank if joiner else self.world.rank
        self.recorder = timeline.start(first) if tc.timeline else None
        if tc.pin_cpus:
            pin_to_cpu(self.world.local_rank)
        self.fault = None if joiner else parse_fault(tc.inject_fault)  # the job's ranks'
        self.data = load_dataset(self.cfg.data)
        self.work = Workload(self.cfg.data, self.data)  # its batches, loss and evaluation
        torch.manual_seed(tc.seed)  # every rank builds the same initial model
        model = build_model(tc.model, self.data)
        sample = self.work.sample_inputs(tc.batch_size)  # what --balance time measures
        # the engine a script's dt.distribute run is too (train/engine.py): the strategy,
        # the prepared model, its optimizer (the default one: --optimizer, --lr) and the step
        self.engine = Engine(self.cfg, model, None, given=Given(self.work.loss, sample, self.fault))
        self.strategy, self.model = self.engine.strategy, self.engine.model
        self.optimizer = self.engine.optimizer
        self.roles = self.strategy.roles  # who trains and who serves (parameter servers)

    @property
    def step(self) -> int:
        """The steps run so far: the engine's count (its ``step`` advances it; a resume, a
        regroup or an admission sets where it goes on from)."""
        return self.engine.steps

    @step.setter
    def step(self, value: int) -> None:
        self.engine.steps = value

    def compiled_graphs(self) -> int:
        """Graphs ``--compile`` captured on this worker (summary.json; 0: eager)."""
        return graphs()

    def prepare(self) -> None:
        """The loop's parts: budget, outputs, progress, step runner, schedule, checkpoints."""
        tc, roles = self.tc, self.roles
        meter.reset()  # count training traffic only, not the initial broadcast
        self.sampler = self._sampler()
        total = run_steps(self.work.train_samples, tc.batch_size, tc.epochs, tc.max_steps)
        # asynchronous strategies let fast workers run more steps, until the budget is spent
        self.epoch_limit, self.step_limit = roles.limits(tc.epochs, total)
        main = self.world.is_main and self.joiner is None
        # the epochs the run will show: a --max-steps inside an epoch ends in that epoch
        # (the job's: an asynchronous worker's own limits are the whole budget)
        shown = min(tc.epochs, self.epoch_limit, -(-total // self.sampler.steps_per_epoch))
        self.out = Outputs(tc, main, goes_on(tc), self.given_trackers, total, shown)
        self.start = time.perf_counter()
        self.throughput = Throughput(tc.batch_size, self.start)  # this process's steps
        assert self.engine.runner is not None  # a worker's (a server serves instead)
        self.runner = self.engine.runner
        self.timers = self.runner.timers
        self.schedule = LRSchedule.for_run(tc, total, self.sampler.steps_per_epoch)
        self.saver = Checkpoints(
            tc.out, self.strategy, tc.async_checkpoint, recorded_settings(self.cfg)
        )
        self._prepare_membership()

    def _prepare_membership(self) -> None:
        """Live shrink and grow, when asked for (summary.json's ``membership``: changes)."""
        tc = self.tc
        self.membership = self.joiner.membership if self.joiner else membership_for(tc, self.world)
        self.changes: list[Change] = []
        member = self.membership
        self.shrink = Shrink(tc, member, self.changes) if member and tc.live_shrink else None
        self.grow = Grow(tc, member, self.changes) if member and tc.live_grow else None
        if self.grow and self.out.main:
            self.grow.open(self.cfg, self.run_id)  # OUT/join.json: where a --join finds the job

    def _sampler(self) -> GlobalBatchSampler:
        """This worker's share of each global batch (again after a membership change)."""
        tc, n, s = self.tc, self.work.train_samples, self.strategy
        rank, shards = data_shard(s)
        return GlobalBatchSampler(n, tc.batch_size, rank, shards, tc.seed)

    def _plan(self, epoch: int, skip: int) -> dict[str, Any]:
        """What the epoch's loader reads: this rank's share of the epoch's global batches
        from ``skip`` on, at most the steps the budget has left (train/workload.py)."""
        tc, sampler = self.tc, self.sampler
        return dict(
            epoch=epoch, skip=skip, limit=self.step_limit - self.step,
            shards=sampler.epoch(epoch) if not self.work.user else [],
            global_batch=tc.batch_size, rank=sampler.rank, world=sampler.world_size,
            seed=tc.seed, prefetch=tc.prefetch, delay=tc.loader_delay_ms / 1000,
            workers=self.cfg.data.loader_workers,
        )  # fmt: skip
