"""The training loop that every strategy shares: one process's view of one run.

    for each step: engine.step(batch, loss), the step a script's dt.distribute run takes
    (train/engine.py; its order, train/step.py: forward + backward (compute) ->
    strategy.after_backward (communication) -> optimizer.step -> strategy.after_step)

Rank 0 evaluates on the test set after every epoch, writes metrics.jsonl,
summary.json and model.pt, and shows the progress bar. :func:`train` reads top to
bottom: ``setup`` (world, data, model, strategy) and ``prepare`` (the loop's parts) build
the run (train/parts.py); :class:`Run`'s ``loop`` goes epoch by epoch (``_epoch``,
``_stepped``, ``_end_epoch``; a membership change is ``_regroup``), then ``summary``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from disttrain import timeline
from disttrain.comm.meter import meter
from disttrain.config import RunConfig
from disttrain.strategies.capabilities import memory
from disttrain.train.evaluation import epoch_end, evaluate, gather_floats, loss_fn
from disttrain.train.oom import as_out_of_memory
from disttrain.train.parts import Change, RunParts
from disttrain.train.pinning import pin_to_cpu
from disttrain.train.resume import resume, say_where_it_goes_on
from disttrain.train.trackers import Tracker

__all__ = ["Run", "evaluate", "loss_fn", "pin_to_cpu", "train"]


def train(cfg: RunConfig, trackers: Sequence[Tracker] = ()) -> dict[str, Any]:
    """Run the training described by ``cfg`` on this process; return its summary.

    Rank 0's summary is the job's. ``trackers`` are told the run's figures and
    checkpoints (:mod:`disttrain.train.trackers`) besides those ``cfg`` asks for.
    A failed allocation is raised as :class:`~disttrain.comm.errors.OutOfMemory`
    naming the rank, the bytes and the process's limit (:mod:`disttrain.train.oom`).
    """
    run = Run(cfg, trackers)
    try:
        run.setup()
        if not run.roles.is_worker:  # a parameter server serves until the end
            return run.roles.serve()
        run.prepare()
        run.loop()
        return run.summary()
    except RuntimeError as exc:
        rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
        oom = as_out_of_memory(exc, rank)
        if oom is None:
            raise
        raise oom from exc


class Run(RunParts):
    """One process's run of ``cfg``: built by :class:`RunParts` (``setup``, ``prepare``),
    then :meth:`loop` and :meth:`summary`."""

    def loop(self) -> None:
        """Epoch by epoch until the budget is spent; after a membership change the epoch
        goes on in the new group."""
        try:
            self.step = self._start_step()
            epoch = self.step // self.sampler.steps_per_epoch
            while epoch < self.epoch_limit:
                change = self._epoch(epoch)
                if change is not None:
                    self._regroup(change)
                    continue
                if self._end_epoch(epoch):
                    break
                epoch += 1
        except BaseException:
            self.out.abandon()
            raise
        finally:
            self._close()

    def _start_step(self) -> int:
        """The step this worker goes on from: a joiner's admission, a resume, or 0."""
        if self.joiner and self.grow:  # admitted at a step boundary, with rank 0's state
            resumed = self.joiner.join(self.grow, self.strategy, self.runner.scaler)
            self.world = self.strategy.world
            self.sampler = self._sampler()
        else:
            resumed = resume(self.tc, self.strategy, self.optimizer, self.runner)
        if self.out.main:
            say_where_it_goes_on(resumed, self.run_id)
        self.throughput.resumed_at(resumed)  # restored steps ran in another process's time
        return resumed

    def _epoch(self, epoch: int) -> Change | None:
        """The epoch's steps (the rest of it after a resume); a membership change or None.
        Each step is the engine's (``engine.step``: the step a script's run takes too)."""
        skip = self.step - epoch * self.sampler.steps_per_epoch  # batches done before
        loader = self.work.loader(self._plan(epoch, skip), self.world.device)
        change = None
        for x, y in timeline.iterate(loader, "data"):
            if self.roles.should_stop():
                break
            if self.grow and self.grow.due(self.step, self.step_limit):  # joiners come in
                self.saver.finish()
                change = self.grow.admit(self.step, self.strategy, self.runner.scaler)
                break
            lr = self.schedule(self.step)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            began = time.perf_counter()
            try:
                with timeline.span("step", step=self.step + 1):
                    self.loss = self.engine.step((x, y), self.work.loss)  # counts the step
            except Exception as exc:  # a lost peer: the survivors regroup (train/shrink.py)
                change = self._lost(exc, began)
                break
            self._stepped(epoch, lr)
        self.timers.seconds["data"] += loader.wait_seconds
        return change

    def _lost(self, exc: Exception, began: float) -> Change:
        """A step failed: the survivors' membership change (live shrink), or ``exc`` again."""
        change = None
        if self.shrink:
            change = self.shrink.recover(
                exc, self.step, self.strategy, began, self.runner.scaler, self.out.logged
            )
        if change is None:
            raise exc
        self.step = change["step"] - 1  # the survivors go on from there, new shards
        return change

    def _stepped(self, epoch: int, lr: float) -> None:
        """After a step: its line in metrics.jsonl, the progress bar, a checkpoint when due."""
        elapsed = time.perf_counter() - self.start
        sps = self.throughput.samples_per_second(self.step, elapsed)
        # with live shrink every worker keeps its line: one that ran a step the new
        # rank 0 did not hands it over (shrink.even_out)
        if (self.out.main or self.shrink) and self.step % self.tc.log_every == 0:
            record = dict(
                step=self.step,
                epoch=epoch,
                loss=self.loss,
                lr=lr,
                samples_per_second=sps,
                wall_seconds=elapsed,
                bytes_sent=meter.bytes_sent,
                **self.strategy.step_metrics(),
            )
            if self.runner.scaler:
                record.update(loss_scale=self.runner.scaler.scale, skipped=self.engine.skipped)
            self.out.step_line(self.step, record)
        self.out.bar.update(self.step, epoch, self.loss, sps)
        if self.tc.checkpoint_every and self.step % self.tc.checkpoint_every == 0 and self.tc.out:
            with self.timers.time("checkpoint"), timeline.span("checkpoint"):
                self.saver.save(self.step, self.optimizer, self.runner)
            self.out.checkpointed(self.step)

    def _regroup(self, change: Change) -> None:
        """After a membership change: the new group's world and shards; a new rank 0 takes
        the outputs over (rank 0 was lost); the change logged; unfinished saves dropped."""
        self.world = self.strategy.world
        self.sampler = self._sampler()
        if self.world.is_main and not self.out.main:
            self.out.take_over()
        self.out.membership(change, self.shrink.take_caught_up() if self.shrink else None)
        self.saver.drop()

    def _end_epoch(self, epoch: int) -> bool:
        """Evaluate (rank 0) and log the epoch; True if it was the run's last."""
        self.epochs_done = epoch + 1
        stop = self.roles.should_stop()
        last = self.step >= self.step_limit or epoch == self.epoch_limit - 1 or stop
        self.memory = memory(self.strategy)
        if last:
            with self.timers.time("checkpoint"), timeline.span("checkpoint"):
                self.saver.close()  # a background write's commit
            self.strategy.finish()
        with self.timers.time("eval"), timeline.span("eval"):
            self.whole, self.test_loss, self.test_acc = epoch_end(
                self.strategy, self.work.evaluate, self.world.device
            )
        figures = dict(test_loss=self.test_loss, test_accuracy=self.test_acc)
        wall = time.perf_counter() - self.start
        record = dict(step=self.step, epoch=epoch, **figures, wall_seconds=wall)
        self.out.line(self.step, {**record, "bytes_sent": meter.bytes_sent})
        return last

    def _close(self) -> None:
        """The outputs closed, whatever ended the loop (a timeline is written even after a
        failure: the launcher merges what is there)."""
        if self.grow and self.out.main:
            self.grow.close(self.step)
        self.out.close()
        if self.recorder is not None:
            timeline.stop()
            self.recorder.write(timeline.parts_folder(self.tc.out, self.tc.timeline))

    def summary(self) -> dict[str, Any]:
        """The run's figures (every worker's traffic and memory gathered); rank 0 writes
        summary.json and model.pt and hands them to the trackers."""
        tc = self.tc
        wall = time.perf_counter() - self.start
        with meter.paused():
            group, device = self.strategy.roles.worker_group, self.world.device
            traffic = [float(meter.bytes_sent), float(meter.messages_sent), meter.bytes_copied]
            per_rank = gather_floats(traffic, device, group)
            names = sorted(self.memory)
            held = gather_floats([float(self.memory[k]) for k in names], device, group)
        if self.recorder is not None and self.out.main:  # every worker has written its part
            timeline.merge(timeline.parts_folder(tc.out, tc.timeline), tc.timeline)
        memory = {k: [int(r[i]) for r in held] for i, k in enumerate(names)}
        summary = {**self._figures(wall, per_rank, memory), **self.strategy.summary()}
        if self.membership is not None:  # every membership change (docs/reliability.md)
            summary["membership"] = self.changes
        self.out.finish(summary, self.whole)
        return summary

    def _figures(
        self, wall: float, per_rank: list[list[float]], memory: dict[str, list[int]]
    ) -> dict[str, Any]:
        """summary.json's own figures (a strategy adds its own)."""
        tc, step = self.tc, self.step
        train_seconds = wall - self.timers.seconds.get("eval", 0.0)
        return {
            "strategy": tc.strategy, "algorithm": tc.algorithm, "model": tc.model,
            "dataset": self.data.name, "world_size": self.world.world_size,
            "workers": len(per_rank), "steps": step,
            # the job's passes over the data: an asynchronous worker's own count may pass
            # the run's --epochs (its limits let one worker do the whole budget)
            "epochs": min(self.epochs_done, tc.epochs), "global_batch_size": tc.batch_size,
            "parameters": sum(p.numel() for p in (self.whole or self.model).parameters()),
            "final_test_loss": self.test_loss, "final_train_loss": self.loss,
            "final_accuracy": self.test_acc, "wall_seconds": wall,
            "samples_per_second": self.throughput.samples_per_second(step, train_seconds),
            "bytes_sent_per_rank": sum(r[0] for r in per_rank) / len(per_rank),
            "bytes_sent_by_rank": [int(r[0]) for r in per_rank],
            "messages_sent_by_rank": [int(r[1]) for r in per_rank],
            "bytes_copied_per_rank": sum(r[2] for r in per_rank) / len(per_rank),
            "time_breakdown": self.timers.as_dict(), "memory_per_rank": memory,
            "precision": tc.precision, "skipped_steps": self.runner.skipped_steps,
            "final_lr": self.schedule(max(step - 1, 0)), "run_id": self.run_id,
            "config": self.cfg.to_dict(), "compiled_graphs": self.compiled_graphs(),
        }  # fmt: skip
