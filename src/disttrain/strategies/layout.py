"""A strategy's process layout: who trains, who serves, and which ranks the job may lose.

The launcher and the trainer ask the layout, never the strategy's step hooks:

    nproc = strategies.get(name).layout.num_processes(cfg)        # launch/job.py
    supervised = strategies.get(name).layout.survives_loss_of(cfg, rank)   # launch/worker.py
    layout = strategy.roles                                       # train/trainer.py
    if not layout.is_worker: layout.serve(); return                # e.g. parameter servers
    epochs, steps = layout.limits(epochs, steps)                   # async: shared work budget
    each step: if layout.should_stop(): break

The default (:class:`Layout`) is what every strategy but the parameter server has:
``--workers`` processes per node, all of them train, losing any one ends the job.
A strategy with other roles subclasses it next to its own file and names it in its
``layout`` class attribute (``strategies/ps.py``'s ``ServerLayout``).
"""

from __future__ import annotations

from typing import Any

from torch.distributed import ProcessGroup

from disttrain.config import RunConfig

__all__ = ["Layout"]


class Layout:
    """Every process trains: ``--workers`` per node; no rank may be lost."""

    # Any, not Strategy: the strategy module imports this one (no import cycle)
    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    # --- before any process starts (the launcher) ---------------------------------
    @classmethod
    def num_processes(cls, config: RunConfig) -> int:
        """Processes to start on each node (servers included, for parameter servers)."""
        return config.train.workers

    @classmethod
    def survives_loss_of(cls, config: RunConfig, rank: int) -> bool:
        """True if the job goes on when process ``rank`` is killed (asynchronous strategies)."""
        del config, rank
        return False

    # --- in each process (the trainer) -------------------------------------------
    @property
    def is_worker(self) -> bool:
        """False for processes that do not train (parameter servers): they ``serve()``."""
        return True

    @property
    def worker_group(self) -> ProcessGroup | None:
        """The group of all worker processes (None: the whole world, every process trains)."""
        return None

    def serve(self) -> dict[str, Any]:
        """Run a non-worker process's role until the job ends; return its figures."""
        raise NotImplementedError(f"{self.strategy.name} has no non-worker role")

    def limits(self, epochs: int, steps: int) -> tuple[int, int]:
        """The most epochs and steps this worker may run, given the run's (called once, after
        ``setup``, before the first step). Asynchronous layouts raise them and end with
        ``should_stop``."""
        return epochs, steps

    def should_stop(self) -> bool:
        """True once the job's work is done, before this worker's own limits (checked per step)."""
        return False
