"""The worker entry point (one process of a job) and its exit-code policy.

Exit codes: 0 done; 1 this worker failed (its line names the rank and the error);
``PEER_EXIT_CODE`` (3) this worker stopped because a *peer* failed, after answering
the roll call that lets the launcher name a peer that hung. Under live shrink
(``--min-workers``) a survivor left with too few workers exits 3 too, leaving its line
(naming the lost ranks) as the job's cause; one the others agreed to go on without exits 0.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from typing import Any

from disttrain.launch.env import WORKER_ENV

__all__ = [
    "CLAIMED_RUN_ENV",
    "Outcome",
    "as_worker",
    "default_out",
    "is_worker",
    "leave",
    "run_joiner",
    "run_worker",
    "torchrun_default_out",
]

#: Set by ``--launcher slurm`` for the agents it starts: the run it already claimed.
CLAIMED_RUN_ENV = "DISTTRAIN_CLAIMED_RUN"


def default_out(strategy: str) -> str:
    """A new folder under runs/ for a job started without ``--out`` (decided by one process)."""
    return os.path.join("runs", f"{time.strftime('%Y%m%d-%H%M%S')}-{strategy}-{os.getpid()}")


def is_worker() -> bool:
    """True inside a worker process: started by our launcher, or by ``torchrun``."""
    return os.environ.get(WORKER_ENV) == "1" or (
        "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ
    )


def leave(code: int) -> None:
    """End a worker process with ``code``, its outputs written and closed by now.

    Without running C++ static destructors: a gloo thread still joinable at interpreter
    exit calls std::terminate (seen once in CI as "terminate called without an active
    exception", SIGABRT). ZeroMQ (the parameter server) delivers queued messages when
    its context ends: end it here, with the servers' linger, since os._exit skips that.
    """
    zmq = sys.modules.get("zmq")
    if zmq is not None:
        zmq.Context.instance().destroy(linger=5000)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def torchrun_default_out(strategy: str) -> str:
    """The folder every rank of one ``torchrun`` job agrees on when ``--out`` is not given.

    Ranks start at different instants in different processes, so a time stamp
    or pid would give each its own folder (and checkpoints, timeline parts and
    roll-call files would scatter). The rendezvous id names the job: ``torchrun
    --standalone`` draws a fresh one per job; a fixed ``--rdzv-id`` reuses it.
    """
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
    return os.path.join("runs", f"torchrun-{run_id}-{strategy}")


def as_worker(cfg: Any) -> tuple[Any, bool]:
    """``cfg`` as this worker runs it, and whether our launcher started it: a ``torchrun``
    worker given no ``--out`` gets the folder every rank of its job agrees on."""
    from disttrain import config

    launched_by_us = os.environ.get(WORKER_ENV) == "1"
    if not cfg.train.out and not launched_by_us:  # torchrun, and no --out
        out = torchrun_default_out(cfg.train.strategy)
        train = dataclasses.replace(cfg.train, out=out)
        cfg = config.RunConfig({**cfg.sections, config.TrainConfig: train}, cfg.given)
    return cfg, launched_by_us


def run_worker(cfg: Any, launched_by_us: bool) -> int:
    """Train this worker's part of the job; its exit code (the module's docstring).

    Called by the entry points themselves (``python -m disttrain`` in a worker, as our
    launcher starts it: ``<module>`` -> this -> ``train`` -> ``Run.loop`` -> ``Run._epoch``
    -> ``Engine.step`` -> ``StepRunner.run`` -> ``Strategy.forward_backward`` ->
    ``loss.backward()``, 7 calls; docs/architecture.md), so ``train`` runs in this frame."""
    from disttrain import strategies
    from disttrain.launch.supervise import run_supervised
    from disttrain.train.trainer import train

    rank = _become_worker()
    # live shrink (--min-workers): a lost worker's process must not end the survivors
    layout = strategies.get(cfg.train.strategy).layout
    if layout.survives_loss_of(cfg, rank) or cfg.train.live_shrink:
        return run_supervised(lambda: _train_worker(cfg, launched_by_us), rank)
    with Outcome(cfg, launched_by_us) as outcome:
        outcome.summary = train(cfg)
    return outcome.code


def _train_worker(cfg: Any, launched_by_us: bool) -> int:
    """:func:`run_worker`'s training, in a supervised child."""
    from disttrain.train.trainer import train

    with Outcome(cfg, launched_by_us) as outcome:
        outcome.summary = train(cfg)
    return outcome.code


def _become_worker() -> int:
    """This process's set-up as a worker (signals, allocator, collector); its rank."""
    from disttrain import lean
    from disttrain.launch import malloc, startup, tether

    tether.tie_from_env()  # exec'd by our launcher: die with it (a forked one already is)
    # The agent stops workers with the launcher's own signal: SIGINT ends a worker at once,
    # as SIGTERM does. As a KeyboardInterrupt it could land inside torch.save, which turned
    # it into a RuntimeError with a traceback (a Ctrl-C mid-checkpoint, 1 suite run in 3)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    lean.apply()  # no torch._dynamo unless something compiles: 0.8 s less per worker
    malloc.keep_freed_buffers()  # a step's model-sized buffers: no fresh pages each step
    startup.freeze()  # the launcher's and this worker's imports: never walked again
    rank = int(os.environ.get("RANK", "0"))
    tether.name(rank)
    return rank


class Outcome:
    """The exit-code policy around a worker's training (the module's docstring): ``with
    Outcome(cfg, launched_by_us) as o: o.summary = train(cfg)``, then ``o.code``. An error
    is written as one line and becomes the code (``DISTTRAIN_DEBUG=1``: raised instead);
    the process group is shut down either way."""

    def __init__(self, cfg: Any, launched_by_us: bool) -> None:
        self.cfg = cfg
        self.launched_by_us = launched_by_us
        self.summary: dict[str, Any] | None = None
        self.code = 0

    def __enter__(self) -> Outcome:
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> bool:
        from disttrain.comm import world
        from disttrain.train.progress import print_summary

        # a KeyboardInterrupt or SystemExit is raised on, as is any error when debugging
        handled = isinstance(exc, Exception) and not os.environ.get("DISTTRAIN_DEBUG")
        try:
            if handled and isinstance(exc, Exception):
                self.code = self._failed(exc)
        finally:
            world.shutdown()
        rank0 = os.environ.get("RANK", "0") == "0"
        if exc is None and not self.launched_by_us and self.summary and rank0:
            print_summary(self.summary, self.cfg.train.out)
        return handled

    def _failed(self, exc: Exception) -> int:
        """Say why this worker stopped, in one line; its exit code."""
        from disttrain.comm.errors import LeftOut, PeerFailure, TooFewWorkers, gist, is_peer_error
        from disttrain.launch import rollcall
        from disttrain.launch.local import PEER_EXIT_CODE, write_cause

        rank = os.environ.get("RANK", "0")
        text = gist(exc)
        if isinstance(exc, LeftOut):  # live shrink went on without this worker: it is lost
            sys.stderr.write(f"disttrain: rank {rank}: {text}\n")
            return 0
        if isinstance(exc, TooFewWorkers):  # the survivors know who is lost: no roll call
            sys.stderr.write(f"disttrain: rank {rank}: {text}\n")
            write_cause(int(rank), f"rank {rank}: {text}")
            return PEER_EXIT_CODE  # passed on by the supervisor: the job ends
        if is_peer_error(exc):
            sys.stderr.write(f"disttrain: rank {rank} stopped: a peer failed ({text})\n")
            # answer the launcher's roll call, so that a peer that hung can be named
            named = exc.rank if isinstance(exc, PeerFailure) else None
            rollcall.answer(int(rank), self.cfg.train.world_size, self.cfg.train.timeout, named)
            return PEER_EXIT_CODE
        sys.stderr.write(f"disttrain: rank {rank}: {type(exc).__name__}: {text}\n")
        write_cause(int(rank), f"rank {rank}: {type(exc).__name__}: {text}")
        return 1


def run_joiner(cfg: Any) -> int:
    """``disttrain train --join OUT``: one worker that joins the job running in OUT (live grow,
    :mod:`disttrain.train.grow`), with the job's settings; 0 once the job's training ends."""
    from disttrain import config
    from disttrain.checkpoint import RUN_ENV
    from disttrain.comm import world
    from disttrain.comm.errors import UsageError, gist
    from disttrain.train.grow import JOIN_POINT, JoinFailed, read_point
    from disttrain.train.trainer import train

    out = cfg.train.join
    # settings given (a strategy's own defaults are not: the job's come from its file)
    given = [name for name in config.changed_settings(cfg) if name in cfg.given - {"join"}]
    if given:
        raise UsageError(
            f"--join {out} takes the job's settings from its {JOIN_POINT}: drop "
            f"{config.flag(given[0])}"
        )
    point = read_point(out)
    cfg = config.load({**point["settings"], "join": out})
    os.environ[RUN_ENV] = point["run"]
    try:
        train(cfg)
    except JoinFailed as exc:
        sys.stderr.write(f"disttrain: error: {exc}\n")
        return 1
    except Exception as exc:
        if os.environ.get("DISTTRAIN_DEBUG"):
            raise
        sys.stderr.write(f"disttrain: joiner: {type(exc).__name__}: {gist(exc)}\n")
        return 1
    finally:
        world.shutdown()
    return 0
