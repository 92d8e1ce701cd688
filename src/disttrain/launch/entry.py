"""``disttrain.train(config)``: one worker's part of a job, in a process group someone else formed.

    import disttrain
    summary = disttrain.train({"strategy": "allreduce", "epochs": 2, "out": "runs/x"})

Ray Train, a Slurm step, ``torchrun`` or the user's own script starts the processes
and (usually) forms the process group; each process then calls :func:`train` with
the same settings. With no group yet, the group is formed from the environment as
a ``torchrun`` worker would (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...), or one
process trains alone. Local rank and host grouping come from the launcher's
variables where it sets them, else from the group itself (:mod:`disttrain.comm.world`).

``config`` is a :class:`~disttrain.config.RunConfig`, a dict of settings (the flags'
names with underscores: ``{"batch_size": 64}``), a TOML file's path, or None;
keyword arguments override it. The job's size is the group's: when ``workers`` is
not given it is chosen so that the strategy's layout fills the group (for the
parameter server, the servers are part of it). The same pre-flight checks as
``disttrain train`` run on every rank (they are deterministic, so every rank refuses
or none does). Every rank returns rank 0's summary.

:func:`disttrain.launch.ray_train.train_loop` (``disttrain.train_loop``) is the same
with Ray Train's signature (one dict), for engines that call a function per worker;
inside Ray Train it also reports checkpoints and the summary through Ray.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from disttrain.comm.errors import UsageError
from disttrain.dataparallel.broadcast import broadcast_json

__all__ = ["fit_to_group", "resolve_config", "train"]


def resolve_config(config: Any = None, **settings: Any) -> Any:
    """A :class:`RunConfig` from a RunConfig, a dict of settings or a TOML path, plus overrides."""
    from disttrain import config as config_mod

    if isinstance(config, config_mod.RunConfig):
        flags: dict[str, Any] = dict(config_mod.changed_settings(config))
        toml = None
    elif isinstance(config, dict):
        flags, toml = dict(config), None
    elif isinstance(config, (str, os.PathLike)):
        flags, toml = {}, os.fspath(config)
    elif config is None:
        flags, toml = {}, None
    else:
        raise UsageError(f"config must be a RunConfig, a dict or a TOML path, not {type(config)}")
    flags.update(settings)
    flags = {k.replace("-", "_"): v for k, v in flags.items()}
    unknown = sorted(set(flags) - set(config_mod.section_fields()))
    if unknown:
        raise UsageError(f"unknown setting {unknown[0]!r} (see `disttrain train --help`)")
    return config_mod.load(flags, toml)


def fit_to_group(cfg: Any, size: int) -> Any:
    """``cfg`` with ``workers`` chosen so that the strategy's processes fill a group of ``size``."""
    import dataclasses

    from disttrain import config as config_mod
    from disttrain import strategies

    layout = strategies.get(cfg.train.strategy).layout
    tc = dataclasses.replace(cfg.train, nnodes=1, node_rank=0, rdzv_endpoint="")
    given = "workers" in config_mod.changed_settings(cfg)
    candidates = [tc.workers] if given else range(1, size + 1)
    for workers in candidates:
        trial = config_mod.RunConfig(
            {**cfg.sections, config_mod.TrainConfig: dataclasses.replace(tc, workers=workers)},
            cfg.given,
        )
        if layout.num_processes(trial) == size:
            return trial
    raise UsageError(
        f"--strategy {cfg.train.strategy} with --workers {cfg.train.workers} needs "
        f"{layout.num_processes(cfg)} processes, but the process group has {size}"
    )


def train(config: Any = None, trackers: Sequence[Any] = (), **settings: Any) -> dict[str, Any]:
    """Run this process's part of the job; every rank returns rank 0's summary."""
    import dataclasses

    from disttrain import config as config_mod
    from disttrain.comm import world
    from disttrain.launch.preflight import preflight
    from disttrain.launch.worker import default_out
    from disttrain.train.trainer import train as run_trainer

    cfg = resolve_config(config, **settings)
    tc = cfg.train
    world.init(device=tc.device, timeout=tc.timeout, threads=tc.threads, backend=tc.backend)
    cfg = fit_to_group(cfg, dist.get_world_size() if dist.is_initialized() else 1)
    preflight(cfg)
    # every rank writes into rank 0's folder (a time stamp differs from process to process)
    out = str(broadcast_json(cfg.train.out or default_out(cfg.train.strategy)))
    cfg = config_mod.RunConfig(
        {**cfg.sections, config_mod.TrainConfig: dataclasses.replace(cfg.train, out=out)},
        cfg.given,
    )
    summary = run_trainer(cfg, trackers)
    return dict(broadcast_json(summary))
