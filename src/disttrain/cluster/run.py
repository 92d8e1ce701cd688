"""``disttrain cluster run -- CMD``: one node per emulated host, output prefixed, all or none.

Each node runs as ``ip netns exec dt-NAME-hI unshare --uts -- python SHIM
HOSTNAME CMD...``: inside host i's network namespace, with ``/etc/hosts``
replaced by the cluster's (see :func:`disttrain.cluster.netns.write_hosts`) and
its own hostname, so torch's c10d rendezvous sees the machine it would see on a
real cluster. ``disttrain train`` commands become the standard multi-node job:
``--nnodes H --node-rank I --rdzv-endpoint <host 0's address>:PORT``, with
gloo pinned to the host's interface (``GLOO_SOCKET_IFNAME``). Any other
command runs as given, with ``DISTTRAIN_CLUSTER_*`` variables telling it where
it is. Every node gets a session of its own, so stopping a node (Ctrl-C, a
timeout, or a peer that failed) stops its whole process tree.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO

from disttrain.cluster.hosts import Cluster, Host, interruptible, signals_held
from disttrain.comm.errors import UsageError

__all__ = ["node_command", "run"]

#: Sets the hostname in the new UTS namespace, then becomes the node's command.
_SHIM = (
    "import os,socket,sys; socket.sethostname(sys.argv[1]); os.execvp(sys.argv[2], sys.argv[2:])"
)
#: After the first node fails, the others get this long to notice and exit on their own.
FAILURE_GRACE_S = 20.0
#: A node asked to stop (SIGTERM) gets this long before SIGKILL.
STOP_GRACE_S = 10.0
_SET_BY_US = ("--nnodes", "--node-rank", "--rdzv-endpoint")


def _train_index(cmd: list[str]) -> int | None:
    """Index of ``train`` in ``disttrain train ...`` / ``python -m disttrain train ...``."""
    for i, word in enumerate(cmd[:-1]):
        if os.path.basename(word) == "disttrain" and cmd[i + 1] == "train":
            return i + 1
    return None


def node_command(cmd: list[str], cluster: Cluster, host: Host, port: int, out: str) -> list[str]:
    """The command host ``host`` runs for the user's ``cmd`` (without the namespace wrapper).

    A leading ``disttrain`` runs as ``python -m disttrain`` with this
    interpreter, so every node runs the same code as the ``cluster`` command.
    """
    if cmd[0] == "disttrain":
        cmd = [sys.executable, "-m", "disttrain", *cmd[1:]]
    if _train_index(cmd) is None:
        return list(cmd)
    given = [w.split("=")[0] for w in cmd]
    clash = [flag for flag in _SET_BY_US if flag in given]
    if clash:
        raise UsageError(f"cluster run sets {', '.join(clash)} itself: leave them out")
    extra = [
        "--nnodes",
        str(len(cluster.hosts)),
        "--node-rank",
        str(host.index),
        "--rdzv-endpoint",
        f"{cluster.hosts[0].address}:{port}",
    ]
    if "--rdzv-id" not in given:
        extra += ["--rdzv-id", f"cluster-{os.getpid()}"]
    if "--out" not in given:  # one folder for all nodes, or each would invent its own
        extra += ["--out", out]
    return [*cmd, *extra]


def _environment(cluster: Cluster, host: Host, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GLOO_SOCKET_IFNAME=host.ifname,  # gloo binds this interface's (private) address
        TP_SOCKET_IFNAME=host.ifname,
        DISTTRAIN_CLUSTER=cluster.name,
        DISTTRAIN_CLUSTER_NODE_RANK=str(host.index),
        DISTTRAIN_CLUSTER_NNODES=str(len(cluster.hosts)),
        DISTTRAIN_CLUSTER_MASTER=f"{cluster.hosts[0].address}:{port}",
        DISTTRAIN_CLUSTER_ADDR=host.address,
    )
    # Nodes share the machine's cores: one intra-op thread each unless told otherwise.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _forward(stream: IO[bytes], tag: bytes, lock: threading.Lock) -> None:
    """Copy a node's output to ours, each line prefixed with ``[hI] ``."""
    for line in iter(stream.readline, b""):
        with lock:
            sys.stdout.buffer.write(tag + line.replace(b"\r", b"").rstrip(b"\n") + b"\n")
            sys.stdout.buffer.flush()
    stream.close()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # the node's session: its agent and its workers


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every node still running (whole process group), then SIGKILL after a grace."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(p.poll() is None for p in alive):
        time.sleep(0.1)
    for p in procs:  # also reaps workers a finished agent left behind
        _signal_group(p, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)


def _say(text: str) -> None:
    sys.stdout.flush()
    sys.stderr.write(f"[cluster] {text}\n")
    sys.stderr.flush()


def run(cluster: Cluster, cmd: list[str], port: int, timeout: float) -> int:
    """Run ``cmd`` on every host; 0 if all nodes succeed, else the first failure's exit code.

    ``timeout`` > 0 stops every node after that many seconds (exit code 124).
    """
    out = os.path.abspath(
        os.path.join("runs", f"{time.strftime('%Y%m%d-%H%M%S')}-cluster-{os.getpid()}")
    )
    commands = [node_command(cmd, cluster, h, port, out) for h in cluster.hosts]
    lock = threading.Lock()
    procs: list[subprocess.Popen[bytes]] = []
    threads = []
    try:
        with interruptible():
            for host, argv in zip(cluster.hosts, commands, strict=True):
                wrapped = [
                    "ip",
                    "netns",
                    "exec",
                    host.ns,
                    "unshare",
                    "--uts",
                    "--",
                    sys.executable,
                    "-c",
                    _SHIM,
                    host.hostname,
                    *argv,
                ]
                with signals_held():  # started and recorded, or neither: _stop sees it
                    proc = subprocess.Popen(
                        wrapped,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        env=_environment(cluster, host, port),
                        start_new_session=True,
                    )
                    procs.append(proc)
                tag = f"[h{host.index}] ".encode()
                t = threading.Thread(target=_forward, args=(proc.stdout, tag, lock), daemon=True)
                t.start()
                threads.append(t)
            return _wait(procs, timeout)
    finally:
        _stop(procs)
        for t in threads:
            t.join(timeout=5)


def _wait(procs: list[subprocess.Popen[bytes]], timeout: float) -> int:
    deadline = time.monotonic() + timeout if timeout > 0 else None
    first_failure: tuple[int, int, float] | None = None  # host, code, when
    reported: set[int] = set()
    while True:
        now = time.monotonic()
        for i, p in enumerate(procs):
            code = p.poll()
            if code is None or i in reported:
                continue
            reported.add(i)
            if code != 0:
                _say(f"host {i} exited with code {code}")
                if first_failure is None:
                    first_failure = (i, code, now)
        if len(reported) == len(procs):
            break
        if first_failure and now - first_failure[2] > FAILURE_GRACE_S:
            _say(f"stopping the other hosts: host {first_failure[0]} failed")
            break
        if deadline is not None and now > deadline:
            _say(f"timeout after {timeout:g} s: stopping all hosts")
            return 124
        time.sleep(0.1)
    if first_failure is None:
        return 0
    return first_failure[1] if first_failure[1] > 0 else 1
