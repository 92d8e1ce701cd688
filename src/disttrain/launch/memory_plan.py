"""Will the workers fit in this host's memory? Checked before any starts (exit 2 if not).

One worker holds, at its fullest (``estimate``):

- its process: torch, gloo's buffers, the interpreter. Measured as the proportional set
  size (``Pss`` of /proc/PID/smaps_rollup, shared pages split among their users) of
  ``disttrain train --workers 8`` at its peak, less that of ``--workers 2``, per added
  worker: about 142 MiB forked (most of torch's pages stay shared with the launcher:
  forked.py) and 292 MiB exec'd (each worker imports torch itself), with the launcher's
  own about 300 MiB (``python benchmarks/worker_memory.py [--threads 2]``; RESULTS,
  "Worker memory"). The figures below round up;
- the strategy's own model state: parameters, gradients and optimizer state as its
  ``predict_memory`` gives them (ZeRO's shards, a pipeline's stage, ...);
- its data set copy, and one batch's activations: every module's output for the
  worker's share of the batch, twice (the output and, in backward, its gradient),
  counted on a forward of a few samples.

The sum over the job's processes must fit in ``MemAvailable`` (/proc/meminfo): the
kernel's estimate of what can be had without swapping. Before this check, ``--workers
64`` of the default run on a 2-core, 24 GB machine printed nothing for minutes while
free memory fell from 22 to 7 GB; ``--workers 200`` would not have fit at all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from disttrain.comm.errors import UsageError
from disttrain.units import human_bytes

__all__ = ["PROCESS_BYTES", "Plan", "available_bytes", "check", "estimate"]

MB = 1 << 20
#: one worker's process before its model (module docstring): forked, exec'd
PROCESS_BYTES = {"forked": 160 * MB, "exec": 320 * MB}
#: the launcher itself (torch's elastic agent in it): Pss of --workers 2 less 2 workers
LAUNCHER_BYTES = 300 * MB
_SAMPLES = 4  # samples of the forward that counts activations


@dataclass(frozen=True)
class Plan:
    """One worker's estimated bytes, by part."""

    process: int
    model_state: int
    data: int
    activations: int

    @property
    def total(self) -> int:
        return self.process + self.model_state + self.data + self.activations


def activation_bytes(model: nn.Module, x: Any) -> int:
    """Bytes of every leaf module's output for one sample of ``x`` (a forward under hooks;
    ``x``: a batch's inputs, a tensor or a dict of them)."""
    from disttrain import batch as batches

    counted = [0]

    def hook(_m: nn.Module, _i: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            counted[0] += out.numel() * out.element_size()

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        with torch.no_grad():
            batches.call_model(model, x)
    finally:
        for h in handles:
            h.remove()
    return counted[0] // max(batches.num_samples(x), 1)


def estimate(cfg: Any, model: nn.Module, data: Any, forked: bool) -> Plan:
    """One worker of ``cfg``'s run at its fullest (module docstring)."""
    from disttrain import costing, strategies
    from disttrain.config import changed_settings
    from disttrain.strategies.runspec import RunSpec
    from disttrain.train.workload import Workload

    tc = cfg.train
    params = sum(p.numel() for p in model.parameters())
    work = costing.Workload(
        params=params, batch_size=tc.batch_size, optimizer=tc.optimizer, precision=tc.precision
    )
    strategy = strategies.get(tc.strategy)
    spec = RunSpec(tc.strategy, tc.strategy, changed_settings(cfg))
    try:
        state = int(strategy.cost_model().predict_memory(spec, work, tc.world_size, model).total)
    except ValueError:  # a layout the formulas do not model: a whole replica's
        state = int(costing.worker_memory(work, params).total)
    per_worker_batch = -(-tc.batch_size // tc.world_size)
    trained_on = Workload(cfg.data, data)
    held = 0  # a user's data set: its own loader holds what it reads
    if not trained_on.user:
        tensors = (data.x_train, data.y_train, data.x_test, data.y_test)
        held = sum(t.numel() * t.element_size() for t in tensors)
    acts = 2 * per_worker_batch * activation_bytes(model, trained_on.sample_inputs(_SAMPLES))
    return Plan(PROCESS_BYTES["forked" if forked else "exec"], state, held, acts)


def available_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo (None where there is none: not Linux)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check(plan: Plan, processes: int, available: int | None, workers: int | None = None) -> None:
    """UsageError naming the largest number of processes that fits, if ``processes`` do
    not; a warning line if there are more ``workers`` (default: all processes) than cores.
    A parameter server's processes are not counted there: they mostly wait."""
    import sys

    if available is not None:
        need = LAUNCHER_BYTES + processes * plan.total
        if need > available:
            fits = max(0, (available - LAUNCHER_BYTES) // plan.total)
            h = human_bytes
            raise UsageError(
                f"{processes} worker processes need about {h(need)} ({h(plan.total)} each: "
                f"{h(plan.process)} process, {h(plan.model_state)} model state, "
                f"{h(plan.data + plan.activations)} data and activations), but this host has "
                f"{h(available)} available; at most {fits} fit: lower --workers"
            )
    cores = len(os.sched_getaffinity(0))
    workers = processes if workers is None else workers
    if workers > cores:
        print(
            f"warning: {workers} workers on {cores} cores: they take turns, so "
            "steps are slower than with fewer workers (fine for trying a layout, not for "
            "timing one)",
            file=sys.stderr,
        )
