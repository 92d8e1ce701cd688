"""``disttrain train --launcher slurm``: inside an allocation, one elastic agent per node via srun.

Run once inside ``sbatch`` or ``salloc``: it reads the allocation (``SLURM_JOB_ID``,
``SLURM_JOB_NODELIST``, ``SLURM_JOB_NUM_NODES``) and runs one job step,

    srun --nodes N --ntasks N --ntasks-per-node 1 --overlap python -m disttrain train ARGS \\
        --launcher local --nnodes N --rdzv-endpoint HEAD:PORT --rdzv-id JOB_ID

so every node runs our elastic agent (torchrun's machinery) with ``--workers``
processes. The rendezvous id is the job id, the head is the first host of the node
list (its c10d store listens on PORT, 29400 + job id mod 1000), as ``torchrun``
under Slurm is usually set up. A one-node allocation needs no c10d: its agent uses
the single-host file rendezvous and nothing listens on the network. Every node's
agent writes checkpoints of one run: the run id drawn here reaches them through
``DISTTRAIN_CLAIMED_RUN`` (srun passes the environment on).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from disttrain.comm.errors import UsageError

__all__ = ["check_allocation", "expand_nodelist", "run_slurm", "srun_command"]

#: c10d port on the head node: a fixed base plus the job id, so two jobs sharing a
#: head node do not collide
PORT_BASE = 29400


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list in order: ``n[01-03,7],gpu1`` -> n01 n02 n03 n7 gpu1.

    The forms ``scontrol show hostnames`` expands (one bracket per name, ranges with
    leading zeros kept); the first entry is the head node.
    """
    hosts: list[str] = []
    for prefix, ranges, suffix in re.findall(r"([^,\[]+)(?:\[([^\]]+)\])?([^,\[]*)", nodelist):
        if not ranges:
            hosts.append(prefix + suffix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{i:0{len(lo)}d}{suffix}")
    return hosts


def srun_command(env: Mapping[str, str], argv: list[str], out: str) -> list[str]:
    """The job step that starts one agent per node of the allocation described by ``env``."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        raise UsageError(
            "--launcher slurm runs inside a Slurm allocation (sbatch or salloc): "
            "SLURM_JOB_ID is not set"
        )
    hosts = expand_nodelist(env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "")))
    nodes = int(env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", len(hosts) or 1)))
    if not hosts:
        raise UsageError("--launcher slurm: SLURM_JOB_NODELIST is empty")
    step = [
        "srun",
        "--nodes",
        str(nodes),
        "--ntasks",
        str(nodes),
        "--ntasks-per-node",
        "1",
        "--overlap",
        "--kill-on-bad-exit=1",
        sys.executable,
        "-m",
        "disttrain",
        *argv,
        "--launcher",
        "local",
        "--out",
        out,
    ]
    if nodes > 1:  # one node rendezvouses through files: no id, nothing listens
        port = PORT_BASE + int(re.sub(r"\D", "", job) or 0) % 1000
        step += ["--rdzv-id", job, "--nnodes", str(nodes), "--rdzv-endpoint", f"{hosts[0]}:{port}"]
    return step


def check_allocation(env: Mapping[str, str]) -> None:
    """UsageError unless this is a Slurm allocation with ``srun`` (before anything is said)."""
    if shutil.which("srun") is None:
        raise UsageError("--launcher slurm: srun is not on PATH (run inside a Slurm allocation)")
    if not env.get("SLURM_JOB_ID"):
        raise UsageError(
            "--launcher slurm runs inside a Slurm allocation (sbatch or salloc): "
            "SLURM_JOB_ID is not set"
        )


def run_slurm(cfg: Any, argv: list[str], out: str, run_id: str) -> int:
    """Run the job step; its exit code (node 0's agent prints the summary)."""
    del cfg
    check_allocation(os.environ)
    cmd = srun_command(os.environ, argv, os.path.abspath(out))
    from disttrain.launch.worker import CLAIMED_RUN_ENV

    env = {**os.environ, CLAIMED_RUN_ENV: run_id}  # every node's agent: this run's checkpoints
    return subprocess.run(cmd, env=env, check=False).returncode
