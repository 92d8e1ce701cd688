"""``disttrain train --launcher slurm`` on a real one-node Slurm that the test configures itself.

The fixture writes a slurm.conf for this host (auth/none: no munge key to share; free
ports; ``NoInAddrAny`` so that slurmd binds 127.0.0.1 only -- slurmctld still binds
every interface, for the test's duration: a network namespace would isolate it, but
name resolution fails inside one on this machine) and runs slurmctld and slurmd;
``examples/slurm/train.sbatch`` is submitted with ``sbatch --wait``. The reference is
one process taking the same steps at the same global batch: the accuracy must agree to
within one test sample.
Where Slurm's tools are missing the test installs the Debian package ``slurm-wlm`` with
apt-get (as root; CI machines are fresh), and is skipped, saying why, only where that
fails or root is missing. The multi-node command is checked statically (one node here).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from disttrain.launch.slurm import expand_nodelist, srun_command
from tests.harness import run_world
from tests.launch.test_entry import ONE_SAMPLE, SETTINGS, _reference
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("slurmctld", "slurmd", "sbatch", "sinfo", "srun")

CONF = """\
ClusterName=disttrain-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
CommunicationParameters=NoInAddrAny
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd.pid
SlurmctldLogFile={tmp}/slurmctld.log
SlurmdLogFile={tmp}/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""

# Both daemons, wait until the node is idle, submit, stop the daemons.
SCRIPT = """\
set -u
slurmctld -D -f "$SLURM_CONF" & ctld=$!
slurmd -D -f "$SLURM_CONF" -N "$NODE" & d=$!
for _ in $(seq 120); do sinfo -h -o %t 2>/dev/null | grep -q idle && break; sleep 0.5; done
sbatch --wait --nodes 1 --cpus-per-task {cpus} --output "$LOG" --export ALL "$@"
rc=$?
kill $d $ctld; wait
exit $rc
"""


def _install_slurm() -> str | None:
    """Install the Debian packages where Slurm's tools are missing (as root, with apt-get):
    CI machines are fresh, so the real-Slurm test would otherwise never run there. None
    once the tools are there, else why not (the skip reason). The packages' own services
    are not started (policy-rc.d exit 101): the test starts its daemons with its own
    config."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if not missing:
        return None
    if shutil.which("apt-get") is None:
        return f"Slurm not installed ({', '.join(missing)}) and no apt-get to install slurm-wlm"
    policy = Path("/usr/sbin/policy-rc.d")
    had_policy = policy.exists()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        if not had_policy:
            policy.write_text("#!/bin/sh\nexit 101\n")
            policy.chmod(0o755)
        cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "slurm-wlm"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        if done.returncode != 0:  # stale package lists on a fresh machine: update once
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=120)
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"Slurm not installed ({', '.join(missing)}): apt-get install slurm-wlm: {exc}"
    finally:
        if not had_policy:
            policy.unlink(missing_ok=True)
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        tail = (done.stderr.strip().splitlines() or [""])[-1]
        return f"Slurm not installed ({', '.join(missing)}): apt-get install slurm-wlm: {tail}"
    return None


def test_nodelists_expand_as_scontrol_does() -> None:
    assert expand_nodelist("n[01-03,7],gpu1") == ["n01", "n02", "n03", "n7", "gpu1"]
    assert expand_nodelist("a1,b[9-10]") == ["a1", "b9", "b10"]


def test_the_job_step_starts_one_agent_per_node_at_the_head_with_the_job_id() -> None:
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_NUM_NODES": "2"}
    cmd = srun_command(env, ["train", "--workers", "4"], "/shared/out")
    assert cmd[:7] == ["srun", "--nodes", "2", "--ntasks", "2", "--ntasks-per-node", "1"]
    tail = " ".join(cmd[cmd.index("disttrain") :])
    assert "--launcher local --out /shared/out" in tail
    assert tail.endswith(
        "--rdzv-id 4242 --nnodes 2 --rdzv-endpoint gpu07:29642"
    )  # 29400 + 4242 mod 1000
    one = srun_command(
        {**env, "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "gpu07"}, ["train"], "/o"
    )
    assert "--rdzv-endpoint" not in one  # one node: the file rendezvous, nothing listens
    assert "--rdzv-id" not in one  # which reads no id (pre-flight refuses one)


def test_outside_an_allocation_it_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = str(REPO / "src")
    proc = subprocess.run(
        [sys.executable, "-m", "disttrain", "train", "--launcher", "slurm", "--max-steps", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr.strip().splitlines()
        == [
            "disttrain: error: --launcher slurm runs inside a Slurm allocation (sbatch or salloc): "
            "SLURM_JOB_ID is not set"
        ]
        or "srun is not on PATH" in proc.stderr
    )


@pytest.mark.timeout(1080)  # 600 s for apt-get at most (slow mirrors), 400 s for the job
def test_a_slurm_job_trains_like_one_process(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the one-node Slurm of this test runs its daemons as root")
    why_not = _install_slurm()
    if why_not:
        pytest.skip(why_not)
    want: dict[str, Any] = run_world(_reference, 1, args=(str(tmp_path / "ref"),), timeout=120)[0]
    host, cpus = socket.gethostname(), os.cpu_count() or 1
    for d in ("state", "spool"):
        (tmp_path / d).mkdir()
    conf = tmp_path / "slurm.conf"
    ports = [free_port(), free_port()]
    conf.write_text(
        CONF.format(host=host, tmp=tmp_path, cpus=cpus, ctld_port=ports[0], d_port=ports[1])
    )
    out, log = tmp_path / "run", tmp_path / "job.log"
    env = {
        **os.environ,
        "SLURM_CONF": str(conf),
        "NODE": host,
        "LOG": str(log),
        "PYTHON": sys.executable,
        "PYTHONPATH": str(REPO / "src"),
        "OMP_NUM_THREADS": "1",
        "WORKERS_PER_NODE": "2",
    }
    args = [
        "--max-steps",
        str(SETTINGS["max_steps"]),
        "--batch-size",
        str(SETTINGS["batch_size"]),
        "--epochs",
        "1",
        "--no-progress",
        "--out",
        str(out),
    ]
    cmd = [
        "bash",
        "-c",
        SCRIPT.format(cpus=cpus),
        "slurm",
        str(REPO / "examples" / "slurm" / "train.sbatch"),
        *args,
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    text = log.read_text() if log.exists() else ""
    assert proc.returncode == 0, proc.stderr[-3000:] + text[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["steps"] == SETTINGS["max_steps"]
    assert abs(summary["final_accuracy"] - want["final_accuracy"]) <= ONE_SAMPLE
    assert "final_accuracy" in text  # node 0's agent printed the summary into the job's log
