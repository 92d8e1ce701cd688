"""The trainer's checkpoints: what one worker saves, and when a step is committed."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from disttrain import checkpoint, strategies
from disttrain.strategies.capabilities import model_state_dict, replicated_state
from disttrain.train.step import StepRunner

__all__ = ["RECORDED", "Checkpoints", "rank_state", "recorded_settings"]

#: The settings a checkpoint records and a ``--resume`` must match (pre-flight compares
#: them): another model, data set or strategy cannot load the state. Each strategy checks
#: its own layout settings itself (``StrategySettings.check_resume``: ZeRO's stage).
RECORDED = ("model", "dataset", "strategy")


def recorded_settings(cfg: Any) -> dict[str, Any]:
    """What a checkpoint of a run of ``cfg`` (a RunConfig) records (:data:`RECORDED`)."""
    return {name: cfg.get(name) for name in RECORDED}


def rank_state(
    strategy: strategies.Strategy, optimizer: torch.optim.Optimizer, runner: StepRunner
) -> dict[str, Any]:
    """This worker's part of a checkpoint (the trainer's per-worker dict, ``step`` aside)."""
    return {
        "model": model_state_dict(strategy),
        "optimizer": optimizer.state_dict(),
        "strategy": strategy.state_dict(),
        "scaler": runner.scaler.state_dict() if runner.scaler else {},
        "rng": torch.get_rng_state(),
    }


class Checkpoints:
    """Every worker saves its state; rank 0 commits once all have (a barrier between).

    Blocking: the save, the barrier and the commit happen at the step. With
    ``--async-checkpoint`` the save copies the state and the process's writer thread
    writes the copy; the step's barrier waits until the next checkpoint (or the end of
    training), when every worker's write has long finished, and rank 0's commit then
    runs on the writer thread too. A crash before the commit leaves the previous
    committed step, as a crash mid-save does.
    """

    def __init__(
        self,
        out_dir: str,
        strategy: strategies.Strategy,
        background: bool,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.out_dir, self.strategy, self.background = out_dir, strategy, background
        self.settings = settings  # recorded in each COMMIT (recorded_settings)
        self.pending: tuple[int, Any] | None = None  # (step, wait for this worker's write)
        self.committing: Any = None  # wait for rank 0's background commit

    def save(self, step: int, optimizer: torch.optim.Optimizer, runner: StepRunner) -> None:
        self.finish()
        s = self.strategy
        n = dist.get_world_size(s.roles.worker_group)
        state = rank_state(s, optimizer, runner)
        wait = checkpoint.save(
            self.out_dir,
            step,
            s.world.rank,
            n,
            state,
            background=self.background,
            replicated=replicated_state(s),
        )
        self.pending = (step, wait)
        if not self.background:
            self.finish()

    def drop(self) -> None:
        """The workers changed (live shrink): a pending step is never committed, since a lost
        worker's part may be missing; this worker's write ends first. The last commit stays."""
        if self.pending is not None:
            (_, wait), self.pending = self.pending, None
            wait()

    def finish(self) -> None:
        """Commit the pending step once every worker's write is on disk."""
        if self.pending is None:
            return
        (step, wait), self.pending = self.pending, None
        wait()
        n = dist.get_world_size(self.strategy.roles.worker_group)
        if n > 1:
            dist.barrier(group=self.strategy.roles.worker_group)
        if self.strategy.world.rank == 0:
            self.committing = checkpoint.commit(
                self.out_dir,
                step,
                world_size=n,
                background=self.background,
                settings=self.settings,
            )

    def close(self) -> None:
        """The end of training: the pending step committed, and that commit done."""
        self.finish()
        if self.committing is not None:
            (wait, self.committing) = (self.committing, None)
            wait()
