"""``disttrain train --launcher ray``: the job's processes are Ray Train workers (``TorchTrainer``).

The driver (this process) checks the settings as ``disttrain train`` does, joins the
Ray cluster at ``--ray-address`` (or starts a local one on 127.0.0.1 with one CPU
per worker), and hands :func:`train_loop` to Ray Train's
``TorchTrainer`` with ``--workers`` workers. Ray starts the workers and forms the
gloo (or NCCL) process group; each worker adopts it (:mod:`disttrain.comm.world`)
and trains its part.

Checkpoints go through Ray's checkpoint API: after disttrain commits step N under
``--out``, every worker reports its own part ``rank-R/`` (rank 0 also the ``COMMIT``
marker) as ``checkpoints/step-N/`` of one Ray checkpoint, which Ray merges into one
folder in its storage (``OUT/ray``) -- a valid ``--resume`` folder. When a worker
fails, Ray restarts the group (``--max-restarts`` = Ray's ``max_failures``) and
:func:`resume_settings` resumes from Ray's latest checkpoint, in the same run.
The summary comes back from rank 0 (``summary.json``, else Ray's last report).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from disttrain.comm.errors import UsageError
from disttrain.launch import reaper
from disttrain.train.trackers import Tracker

__all__ = [
    "RayReporter",
    "check_layout",
    "resume_settings",
    "run_ray",
    "session_trackers",
    "train_loop",
]

#: Settings of the driver that the workers must not see (they would launch again).
_DRIVER_ONLY = ("launcher", "ray_address", "workers", "nnodes", "node_rank", "rdzv_endpoint")


def _in_ray_train() -> bool:
    if "ray" not in sys.modules:
        return False
    try:
        import ray.train

        ray.train.get_context().get_world_rank()
    except Exception:
        return False
    return True


class RayReporter(Tracker):
    """Tells Ray Train each committed checkpoint and the summary (every worker, in step)."""

    def __init__(self) -> None:
        import ray.train

        self.train = ray.train
        self.rank = ray.train.get_context().get_world_rank()
        self.last: dict[str, float] = {}

    def scalars(self, step: int, values: Mapping[str, Any]) -> None:
        for key in ("loss", "test_loss", "test_accuracy"):
            value = values.get(key)
            if isinstance(value, (int, float)):
                self.last[key] = float(value)

    def checkpoint(self, step: int, folder: str) -> None:
        import torch.distributed as dist

        # rank 0 commits after the ranks' barrier; wait until the step folder is there
        dist.barrier()
        with tempfile.TemporaryDirectory(prefix="disttrain-ray-") as tmp:
            dest = os.path.join(tmp, "checkpoints", os.path.basename(folder))
            os.makedirs(dest)
            # this worker's part (a DCP folder) and, from rank 0, the commit marker
            shutil.copytree(
                os.path.join(folder, f"rank-{self.rank:05d}"),
                os.path.join(dest, f"rank-{self.rank:05d}"),
            )
            if self.rank == 0:
                shutil.copy2(os.path.join(folder, "COMMIT"), os.path.join(dest, "COMMIT"))
            self.train.report(
                {"step": step, **self.last},
                checkpoint=self.train.Checkpoint.from_directory(tmp),
                checkpoint_dir_name=os.path.basename(folder),
            )

    def finish(self, summary: Mapping[str, Any], is_main: bool) -> None:
        # every worker reports (a report is a barrier); Ray keeps rank 0's metrics
        self.train.report({"step": int(summary.get("steps", 0)), "summary": json.dumps(summary)})


def session_trackers() -> list[Tracker]:
    """Inside a Ray Train worker: the reporter; elsewhere none."""
    return [RayReporter()] if _in_ray_train() else []


def resume_settings(out: str) -> dict[str, Any]:
    """Inside a restarted Ray Train worker: where to resume from.

    Ray's latest checkpoint when its controller registered one. Ray registers a
    report only when it next polls the workers, so a worker that dies soon after a
    checkpoint may leave Ray with none: the run's own newest committed step in
    ``out`` (this run's id, so never another run's) is then the restart point,
    on one machine or a shared file system.
    """
    if not _in_ray_train():
        return {}
    import ray.train

    from disttrain import checkpoint

    latest = ray.train.get_checkpoint()
    if latest is not None:
        source = latest.to_directory()  # remote storage: a local copy
    elif out and checkpoint.latest(out, checkpoint.current_run()) is not None:
        source = out
    else:
        return {}
    # A restart round, as torch's agent numbers them: metrics.jsonl is appended to and
    # --inject-fault fires only in the first round (train/faults.py).
    os.environ["TORCHELASTIC_RESTART_COUNT"] = "1"
    return {"resume": source}


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train's ``train_loop_per_worker``: ``disttrain.train``, reporting to Ray inside Ray."""
    from disttrain import lean
    from disttrain.launch.entry import train

    lean.apply()  # as our own workers: no torch._dynamo unless something compiles
    settings = dict(config)
    settings.update(resume_settings(str(settings.get("out", ""))))
    train(settings, session_trackers())


def check_layout(cfg: Any) -> int:
    """The number of Ray workers; UsageError for what Ray cannot run (before anything starts)."""
    from disttrain import strategies

    tc = cfg.train
    nproc = int(strategies.get(tc.strategy).layout.num_processes(cfg))
    if tc.nnodes != 1:
        raise UsageError(
            "--launcher ray decides where its workers run: drop --nnodes and give --workers "
            "for all of them"
        )
    if nproc != tc.workers:
        raise UsageError(
            f"--launcher ray runs --workers training processes: --strategy {tc.strategy} "
            "also starts servers, and --nnodes is Ray's to decide (use --workers for all of them)"
        )
    if tc.async_checkpoint:  # Ray is told of a step when it is written, not a step later
        raise UsageError(
            "--launcher ray reports each checkpoint to Ray as soon as it is committed: "
            "drop --async-checkpoint (its commit lands at the next checkpoint)"
        )
    return nproc


def run_ray(cfg: Any, out: str, run_id: str) -> dict[str, Any]:
    """Run the job on Ray Train workers; return rank 0's summary."""
    from disttrain import config as config_mod

    tc = cfg.train
    nproc = check_layout(cfg)
    try:
        import ray
        from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer
    except ImportError:
        raise UsageError("--launcher ray needs Ray Train: pip install 'ray[train]'") from None
    settings = {k: v for k, v in config_mod.changed_settings(cfg).items() if k not in _DRIVER_ONLY}
    settings.update(out=os.path.abspath(out), progress=False)
    env = _worker_env(tc, run_id)
    if not tc.ray_address:  # a local Ray: its processes end with this one (launch/reaper.py)
        reaper.watch()
    _init_ray(ray, tc, nproc, env)
    nccl = tc.device == "cuda" and tc.backend != "gloo"  # --backend gloo: ranks share a GPU
    try:
        trainer = TorchTrainer(
            train_loop,
            train_loop_config=settings,
            torch_config=TorchConfig(
                backend="nccl" if nccl else "gloo", timeout_s=int(max(tc.timeout, 30))
            ),
            scaling_config=ScalingConfig(
                num_workers=nproc, use_gpu=tc.device == "cuda", resources_per_worker={"CPU": 1}
            ),
            run_config=RunConfig(
                name=f"disttrain-{run_id}",
                storage_path=os.path.join(os.path.abspath(out), "ray"),
                failure_config=FailureConfig(max_failures=tc.max_restarts),
                checkpoint_config=CheckpointConfig(num_to_keep=2),
            ),
        )
        result = trainer.fit()
    finally:
        ray.shutdown()
    return _summary(out, result)


def _worker_env(tc: Any, run_id: str) -> dict[str, str]:
    """The workers' environment: the run id, threads, this driver's import path, the plugin
    and debug variables; a local Ray's group meets on the loopback."""
    env = {
        "DISTTRAIN_RUN_ID": run_id,  # every worker and restart writes checkpoints of this run
        "OMP_NUM_THREADS": str(tc.threads),
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)),
    }
    for name in ("DISTTRAIN_PLUGINS", "DISTTRAIN_DEBUG"):
        if name in os.environ:
            env[name] = os.environ[name]
    if not tc.ray_address:
        env["GLOO_SOCKET_IFNAME"] = "lo"  # a local Ray: the group meets on the loopback
        # nothing preempts this machine's own Ray: no watcher actor (a process importing
        # Ray, ~2 CPU-s, again at every restart) polling for it
        env["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = "0"
    return env


def _init_ray(ray: Any, tc: Any, nproc: int, env: dict[str, str]) -> None:
    """Join the Ray cluster at ``--ray-address``, or start a local one with ``nproc`` CPUs.

    Up to three tries: Ray waits a fixed 30 s for its raylet to register, which a
    busy machine misses; any other failure is raised at once.
    """
    local = not tc.ray_address
    for attempt in range(3):
        try:
            ray.init(
                address=tc.ray_address or None,
                num_cpus=nproc if local else None,
                include_dashboard=False,
                _node_ip_address="127.0.0.1" if local else None,
                runtime_env={"env_vars": env},
                logging_level=logging.ERROR,
                log_to_driver=False,  # Ray's per-report chatter; failures come back in the error
            )
            break
        except Exception as exc:
            # Ray waits a fixed 30 s for its raylet to register: a busy machine misses it
            ray.shutdown()
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise


def _summary(out: str, result: Any) -> dict[str, Any]:
    """Rank 0's summary: its summary.json if rank 0 ran on this machine, else its last report."""
    path = os.path.join(out, "summary.json")
    if os.path.exists(path):  # rank 0 ran on this machine
        with open(path) as fh:
            return dict(json.load(fh))
    if not result.metrics or "summary" not in result.metrics:
        raise RuntimeError("Ray Train ended without rank 0's summary")
    return dict(json.loads(result.metrics["summary"]))
