"""``disttrain run -np N COMMAND...``: horovodrun's local launch, for Horovod scripts.

Starts N processes of COMMAND on this host, each with torchrun's variables
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``),
Horovod's (``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_*``, ``HOROVOD_CROSS_*``,
``HOROVOD_HOSTNAME``, ``HOROVOD_CONTROLLER``/``HOROVOD_CPU_OPERATIONS`` = gloo) and the
file store they meet on (``DISTTRAIN_STORE_FILE``: nothing listens beyond 127.0.0.1).
Each process is SIGKILLed by the kernel when the launcher dies (``launch/tether.py``);
when one fails, the others are stopped and the launcher exits with its code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from disttrain.comm.errors import UsageError
from disttrain.comm.world import STORE_FILE_ENV
from disttrain.launch import jobdir
from disttrain.launch.tether import tie

__all__ = ["add_arguments", "command_of", "run", "worker_env"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-np",
        "--num-proc",
        type=int,
        required=True,
        dest="np",
        help="processes to start on this host",
    )
    parser.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        metavar="command",
        help="the command each process runs (python script.py args...)",
    )


def worker_env(rank: int, size: int, store: str) -> dict[str, str]:
    """The variables one process gets: torchrun's and horovodrun's (one host)."""
    ranks = {
        "RANK": rank,
        "WORLD_SIZE": size,
        "LOCAL_RANK": rank,
        "LOCAL_WORLD_SIZE": size,
        "GROUP_RANK": 0,
        "HOROVOD_RANK": rank,
        "HOROVOD_SIZE": size,
        "HOROVOD_LOCAL_RANK": rank,
        "HOROVOD_LOCAL_SIZE": size,
        "HOROVOD_CROSS_RANK": 0,
        "HOROVOD_CROSS_SIZE": 1,
    }
    env = {k: str(v) for k, v in ranks.items()}
    env.update(
        {
            "HOROVOD_HOSTNAME": "localhost",
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": "lo",
            "PYTHONUNBUFFERED": "1",
            STORE_FILE_ENV: store,
        }
    )
    return env


def _stop(procs: list[subprocess.Popen[Any]]) -> None:
    """SIGTERM the ones still running, then SIGKILL after 5 s."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def command_of(cmd: list[str]) -> list[str]:
    """The command each process runs: a bare ``python`` or ``python3`` is the interpreter
    that runs disttrain (``disttrain run`` from a venv not activated found the system's,
    without torch), as horovodrun users type it."""
    cmd = cmd[1:] if cmd[:1] == ["--"] else cmd
    return [sys.executable, *cmd[1:]] if cmd[:1] in (["python"], ["python3"]) else cmd


def run(ns: argparse.Namespace, argv: list[str]) -> int:
    command = command_of(ns.cmd)
    if not command:
        raise UsageError("run: give the command to start, e.g. disttrain run -np 2 python x.py")
    if ns.np < 1:
        raise UsageError(f"run: -np must be at least 1, got {ns.np}")
    folder = jobdir.make("run")
    me = os.getpid()
    procs: list[subprocess.Popen[Any]] = []
    try:
        for rank in range(ns.np):
            env = {**os.environ, **worker_env(rank, ns.np, os.path.join(folder, "store"))}
            procs.append(subprocess.Popen(command, env=env, preexec_fn=lambda: _tie(me)))
        return _wait(procs)
    except FileNotFoundError as exc:
        raise UsageError(f"run: cannot start {command[0]!r}: {exc.strerror}") from exc
    except KeyboardInterrupt:
        return 130  # the processes are stopped below
    finally:
        _stop(procs)
        shutil.rmtree(folder, ignore_errors=True)


def _tie(launcher: int) -> None:
    tie(launcher)  # dies with the launcher, however it dies
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait(procs: list[subprocess.Popen[Any]]) -> int:
    """0 when every process exits 0; else the first failure's code, the others stopped."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            rank, code = failed[0]
            sys.stderr.write(
                f"disttrain run: rank {rank} exited with code {code}; stopping the others\n"
            )
            _stop(procs)
            return code if code and code > 0 else 1
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.05)
