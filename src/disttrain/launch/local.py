"""Start the workers of one node with PyTorch's elastic launcher, and explain how they ended.

Single-host jobs rendezvous through files (no listening socket); multi-node
jobs use torch's ``c10d`` rendezvous at ``--rdzv-endpoint``, exactly as
``torchrun --rdzv-backend c10d`` would. c10d numbers the nodes itself: when a
round completes it sorts the nodes' descriptors (host name, as
``socket.getfqdn()`` gives it, then the agent's pid) and node i of that order
holds global ranks i·P..i·P+P-1 (torch's ``dynamic_rendezvous.py``,
``_mark_rendezvous_complete``). It reads no rank from its configuration (only
the ``static`` backend does), so ``--node-rank`` is not passed to it.

Each worker runs ``python -m disttrain ARGS`` with ``DISTTRAIN_WORKER=1`` set,
so the worker entry point is the same one that ``torchrun -m disttrain train
...`` runs on a cluster. On one host, with the CPU and one thread a worker, the
launcher forks that entry point instead of exec'ing it (:mod:`.forked`).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import uuid
from typing import Any

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from disttrain.checkpoint import RUN_ENV
from disttrain.collectives.shmseg import JOB_ENV, remove_leftovers
from disttrain.comm.world import STORE_FILE_ENV
from disttrain.config import TrainConfig
from disttrain.launch import forked, jobdir, rendezvous, rollcall, tether
from disttrain.launch.env import WORKER_ENV

__all__ = [
    "CAUSES_ENV",
    "PEER_EXIT_CODE",
    "WORKER_ENV",
    "JobFailed",
    "Stopped",
    "forks_workers",
    "launch",
    "launch_config",
    "multi_node",
    "write_cause",
]

#: A worker exits with this code when it stops because a *peer* failed.
PEER_EXIT_CODE = 3
#: The folder where a failing worker leaves its one-line cause (file named by its rank), so
#: the job's last line is what the failing rank said, not torch elastic's generic advice.
CAUSES_ENV = "DISTTRAIN_CAUSES"


def write_cause(rank: int, line: str) -> None:
    """Called by a failing worker: leave ``line`` ("rank 1: NonFiniteGradient: ...")."""
    folder = os.environ.get(CAUSES_ENV)
    if folder and os.path.isdir(folder):
        with open(os.path.join(folder, str(rank)), "w") as fh:
            fh.write(line)


def _cause(folder: str, rank: int) -> str:
    try:
        with open(os.path.join(folder, str(rank))) as fh:
            return fh.read().strip()
    except OSError:
        return ""


class JobFailed(RuntimeError):
    """The job ended because a worker failed; the message names the rank."""

    def __init__(self, message: str, rank: int | None) -> None:
        super().__init__(message)
        self.rank = rank


class Stopped(RuntimeError):
    """The launcher got SIGINT (Ctrl-C) or SIGTERM; torch's agent has stopped the workers
    with the same signal. ``code`` is the shell's for it: 128 + the signal's number."""

    def __init__(self, sig: int) -> None:
        super().__init__(signal.Signals(sig).name)
        self.signal = sig
        self.code = 128 + sig


def _describe(rank: int, failure: ProcessFailure, cause: str = "") -> str:
    """``rank 1: NonFiniteGradient: ... [worker rank 1 (pid 7) exited with code 1]`` when the
    worker left its cause, else the agent's view of the process."""
    code = failure.exitcode
    if code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    if cause:
        return f"{cause} [worker rank {rank} (pid {failure.pid}) {how}"
    detail = ""
    message = failure.message if isinstance(failure.message, str) else ""
    # "To enable traceback see: https://pytorch.org/..." is torch elastic's advice, not a cause
    if message and message != "<N/A>" and "Signal" not in message and "traceback" not in message:
        detail = f": {message.strip().splitlines()[-1]}"
    return f"worker rank {rank} (pid {failure.pid}) {how}{detail}"


def root_cause(
    failures: dict[int, ProcessFailure],
    answers: dict[int, int | None] | None = None,
    members: int = 0,
) -> tuple[int, ProcessFailure, bool]:
    """The failed rank that caused the others to stop, and whether it hung.

    Not one that exited because a peer failed (PEER_EXIT_CODE), nor one the
    agent stopped with SIGTERM after the first failure. When every failure is
    of that kind, someone hung: the worker (rank < ``members``) that did not
    answer the roll call of its peers (``answers``, see :mod:`rollcall`), or
    else the rank a peer's error named.
    """
    collateral = (PEER_EXIT_CODE, -signal.SIGTERM)
    own = {r: f for r, f in failures.items() if f.exitcode not in collateral}
    if not own and answers:
        silent = [r for r in sorted(failures) if r < members and r not in answers]
        named = sorted({r for r in answers.values() if r is not None and r in failures})
        for r in silent or named:
            return r, failures[r], True
    pool = own or failures

    def first(item: tuple[int, ProcessFailure]) -> tuple[int, bool, int]:
        # a failure without an error file is stamped when the agent saw it, to the second:
        # in one second, a rank killed by a signal (from outside: the kernel, a user) came
        # before one that exited on an error of its own, likely the dead peer's (a CI run
        # named worker 1, exit 1, for the SIGKILLed server 2 seen in the same pass)
        return item[1].timestamp, item[1].exitcode >= 0, item[0]

    rank, failure = min(pool.items(), key=first)
    return rank, failure, False


def multi_node(cfg: TrainConfig) -> bool:
    """Whether the job rendezvouses through torch's c10d (else: this host's files)."""
    return cfg.nnodes > 1 or bool(cfg.rdzv_endpoint)


def forks_workers(cfg: TrainConfig) -> bool:
    """One host, the CPU, one thread a worker: workers are forked from the launcher, not
    exec'd (forked.py). Live shrink and grow too, since liveness is judged by heartbeats
    (comm/membership.py): with forked workers a survivor had missed the 3 s answer window
    that came before them in 2 of 5 suite runs; exec'd, each worker's start cost about
    6 CPU-s more (a 1-step `--workers 3 --min-workers 2` run: 9.6 CPU-s against 3.4)."""
    return not multi_node(cfg) and cfg.device == "cpu" and cfg.threads == 1


def launch_config(cfg: TrainConfig, nproc_per_node: int, tmp: str) -> LaunchConfig:
    """The elastic launcher's configuration for this node (``tmp``: the job's private folder).

    Single host: the file rendezvous (its store in ``tmp``), a fresh run id. Multi-node:
    c10d at ``--rdzv-endpoint`` with ``--rdzv-id``, and no rank in ``rdzv_configs``:
    c10d ignores it and assigns node ranks by sorted host name (module docstring).
    """
    rdzv_configs: dict[str, Any]
    if not multi_node(cfg):
        backend, endpoint = rendezvous.BACKEND, ""
        rdzv_configs = {"store_path": os.path.join(tmp, "agent.store")}
        run_id = f"disttrain-{uuid.uuid4().hex[:12]}"
    else:
        backend, endpoint = "c10d", cfg.rdzv_endpoint
        rdzv_configs = {}
        run_id = cfg.rdzv_id
    return LaunchConfig(
        min_nodes=cfg.nnodes,
        max_nodes=cfg.nnodes,
        nproc_per_node=nproc_per_node,
        run_id=run_id,
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        rdzv_configs=rdzv_configs,
        max_restarts=cfg.max_restarts,
        monitor_interval=0.1,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=os.path.join(tmp, "logs")),
    )


def _quiet_torch_elastic() -> None:
    """Silence torch elastic's loggers: we explain failures and signals ourselves. Each of
    its modules sets its own level (its ``get_logger``), so setting the package's is not
    enough."""
    prefixes = ("torch.distributed.elastic", "torch.distributed.launcher")
    for name in [*prefixes, *logging.root.manager.loggerDict]:
        if name.startswith(prefixes):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def launch(
    cfg: TrainConfig, nproc_per_node: int, argv: list[str], checkpoint_run: str | None = None
) -> None:
    """Run ``disttrain ARGV`` on ``nproc_per_node`` local processes; raise :class:`JobFailed`.

    ``checkpoint_run`` (the run the checkpoints belong to; not the rendezvous id)
    reaches every worker, of every restart, through ``DISTTRAIN_RUN_ID``.
    """
    _quiet_torch_elastic()
    tmp = jobdir.make("job")
    calls = os.path.join(tmp, "rollcall")
    causes = os.path.join(tmp, "causes")
    os.makedirs(causes)
    env_backup = dict(os.environ)
    os.environ[CAUSES_ENV] = causes
    os.environ[WORKER_ENV] = "1"
    os.environ[tether.LAUNCHER_ENV] = str(os.getpid())  # an exec'd worker dies with us too
    # every shared-memory segment of the job carries this tag (its name names this pid):
    # what a rank killed while creating one left is removed when the job ends
    shm_tag = f"j{os.getpid()}x{uuid.uuid4().hex[:8]}"
    os.environ[JOB_ENV] = shm_tag
    os.environ.setdefault("OMP_NUM_THREADS", str(cfg.threads))
    if checkpoint_run is not None:
        os.environ[RUN_ENV] = checkpoint_run
    if not multi_node(cfg):
        rendezvous.register()
        os.environ[STORE_FILE_ENV] = os.path.join(tmp, "workers.store")
        os.makedirs(calls, exist_ok=True)
        os.environ[rollcall.ENV] = calls  # how a hung worker gets named
    config = launch_config(cfg, nproc_per_node, tmp)
    forking = forks_workers(cfg)
    if forking and (cfg.checkpoint_every or cfg.resume):
        # every forked worker saves or loads a checkpoint: torch.distributed.checkpoint
        # imported here once (about 0.85 s of CPU; checkpoint/__init__.py imports it at
        # first use) rather than once a worker
        import disttrain.checkpoint.dcp  # noqa: F401
    try:
        with forked.forking(forking):
            elastic_launch(config, sys.executable)("-m", "disttrain", *argv)
    except SignalException as exc:  # the agent's handler of SIGINT and SIGTERM raised it
        raise Stopped(int(exc.sigval)) from None
    except ChildFailedError as exc:
        answers = rollcall.read(calls)
        rank, failure, hung = root_cause(exc.failures, answers, cfg.world_size)
        others = len(exc.failures) - 1
        tail = f"; {others} other worker(s) stopped because of it" if others else ""
        if hung:
            why = (
                f"worker rank {rank} (pid {failure.pid}) hung: no answer within --timeout "
                f"{cfg.timeout:g} s, while {len(answers)} peer(s) that waited on it did answer"
            )
        else:
            why = _describe(rank, failure, _cause(causes, rank))
        close = "]" if why.startswith("rank ") else ""  # the cause first, the process after
        raise JobFailed(why + tail + close, rank) from None
    finally:
        os.environ.clear()
        os.environ.update(env_backup)
        shutil.rmtree(tmp, ignore_errors=True)
        remove_leftovers(shm_tag)
