"""``disttrain run -np N COMMAND...``: horovodrun's local launch, for Horovod scripts.

Starts N processes of COMMAND on this host, each with torchrun's variables
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``),
Horovod's (``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_*``, ``HOROVOD_CROSS_*``,
``HOROVOD_HOSTNAME``, ``HOROVOD_CONTROLLER``/``HOROVOD_CPU_OPERATIONS`` = gloo) and the
file store they meet on (``DISTTRAIN_STORE_FILE``: nothing listens beyond 127.0.0.1).
Starting, tying and stopping them is :mod:`disttrain.launch.ranks`'s: each process is
SIGKILLed by the kernel when the launcher dies; when one fails, the others are stopped
and the launcher exits with its code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from disttrain.comm.errors import UsageError
from disttrain.comm.world import STORE_FILE_ENV
from disttrain.launch import jobdir, ranks

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
    try:
        store = os.path.join(folder, "store")
        return ranks.run(command, [worker_env(r, ns.np, store) for r in range(ns.np)])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
