"""The emulated cluster: ``disttrain cluster up | status | run | measure | down``.

``up`` builds H "hosts" on this machine. Each host is a network namespace
``dt-NAME-hI`` with loopback and one interface ``dt-hI`` holding a private
address (host i gets the (i+1)-th address of ``--subnet``, 10.77.0.0/24 by
default). A veth cable joins it to port ``dt-pI`` of a Linux bridge ``dt-br``
that lives in a namespace of its own, ``dt-NAME-br``: the switch. Both ends
of every cable send through a token bucket (tc tbf) at ``--bandwidth``, so each
host has a full-duplex NIC of that rate on a non-blocking switch. The
machine's own interfaces and routes are never touched, and the hosts can reach
nothing but each other.

The layout is kept in a JSON state file (``$DISTTRAIN_CLUSTER_DIR/NAME.json``,
default folder ``/run/disttrain-cluster``), written *before* anything is
created, so ``down`` finds a half-built cluster too; ``down`` also removes any
namespace named ``dt-NAME-*`` that the state file does not list.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import re
import signal
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from types import FrameType
from typing import Any

from disttrain.comm.errors import UsageError
from disttrain.launch import netns

__all__ = [
    "Cluster",
    "Host",
    "add_arguments",
    "down",
    "load",
    "main",
    "plan",
    "state_path",
    "up",
]

DEFAULT_NAME = "main"
DEFAULT_SUBNET = "10.77.0.0/24"
MAX_HOSTS = 64
_NAME = re.compile(r"^[a-z][a-z0-9]{0,7}$")  # keeps "dt-NAME-hNN" within 15 characters


@dataclass(frozen=True)
class Host:
    """One emulated machine: its namespace, interface, address and hostname."""

    index: int
    ns: str
    ifname: str
    port: str  # the bridge's end of the cable, in the bridge namespace
    address: str

    @property
    def hostname(self) -> str:
        return self.ns


@dataclass(frozen=True)
class Cluster:
    """The layout of a cluster, as saved in its state file."""

    name: str
    rate_bits: int
    subnet: str
    bridge_ns: str
    bridge: str
    hosts: tuple[Host, ...]

    @property
    def prefix(self) -> str:
        return f"{netns.PREFIX}{self.name}-"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Cluster:
        raw = json.loads(text)
        hosts = tuple(Host(**h) for h in raw.pop("hosts"))
        return cls(hosts=hosts, **raw)


def state_dir() -> str:
    return os.environ.get("DISTTRAIN_CLUSTER_DIR", "/run/disttrain-cluster")


def state_path(name: str) -> str:
    return os.path.join(state_dir(), f"{name}.json")


def _check_name(name: str) -> None:
    if not _NAME.match(name):
        raise UsageError(
            f"--name {name!r}: use 1-8 lowercase letters or digits, starting with a letter"
        )


def plan(name: str, hosts: int, bandwidth: str, subnet: str = DEFAULT_SUBNET) -> Cluster:
    """Check the request and lay out the cluster (nothing is created)."""
    _check_name(name)
    if not 1 <= hosts <= MAX_HOSTS:
        raise UsageError(f"--hosts must be between 1 and {MAX_HOSTS}, got {hosts}")
    rate = netns.parse_rate(bandwidth)
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as exc:
        raise UsageError(f"--subnet {subnet!r} is not an IPv4 network: {exc}") from None
    if not net.is_private:
        raise UsageError(f"--subnet {subnet} is not a private network (e.g. 10.77.0.0/24)")
    addresses = list(net.hosts())
    if len(addresses) < hosts:
        raise UsageError(f"--subnet {subnet} has room for {len(addresses)} hosts, not {hosts}")
    prefix = f"{netns.PREFIX}{name}-"
    members = tuple(
        Host(i, f"{prefix}h{i}", f"dt-h{i}", f"dt-p{i}", str(addresses[i])) for i in range(hosts)
    )
    return Cluster(name, rate, str(net), f"{prefix}br", "dt-br", members)


def load(name: str) -> Cluster | None:
    """The cluster ``name`` as its state file describes it, or None."""
    try:
        with open(state_path(name)) as fh:
            return Cluster.from_json(fh.read())
    except FileNotFoundError:
        return None


def _save(cluster: Cluster) -> None:
    os.makedirs(state_dir(), exist_ok=True)
    tmp = state_path(cluster.name) + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(cluster.to_json())
    os.replace(tmp, state_path(cluster.name))


class _Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: unwind (and clean up) as Ctrl-C would."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise _Terminated(signal.Signals(signum).name)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into an exception for the duration, so ``finally`` blocks run."""
    old = {s: signal.signal(s, _raise_terminated) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def up(cluster: Cluster) -> None:
    """Create ``cluster``; on any failure or signal, remove whatever was created."""
    netns.check_tools()
    if load(cluster.name) is not None or netns.list_namespaces(cluster.prefix):
        raise UsageError(
            f"cluster {cluster.name!r} is already up: `disttrain cluster down --name "
            f"{cluster.name}` first"
        )
    _save(cluster)  # first, so that `down` can find a half-built cluster
    try:
        with interruptible():
            netns.add_namespace(cluster.bridge_ns)
            netns.add_bridge(cluster.bridge_ns, cluster.bridge)
            entries = [(h.address, h.hostname) for h in cluster.hosts]
            plen = ipaddress.IPv4Network(cluster.subnet).prefixlen
            for h in cluster.hosts:
                netns.add_namespace(h.ns)
                netns.add_veth(
                    h.ns, h.ifname, f"{h.address}/{plen}", cluster.bridge_ns, h.port, cluster.bridge
                )
                netns.shape(h.ns, h.ifname, cluster.rate_bits)  # what host i sends
                netns.shape(cluster.bridge_ns, h.port, cluster.rate_bits)  # what it receives
                netns.write_hosts(h.ns, entries)
    except BaseException as exc:
        down(cluster.name)
        if isinstance(exc, netns.IpError):
            raise UsageError(f"cluster up failed (nothing was left behind): {exc}") from None
        raise


def down(name: str) -> list[str]:
    """Remove cluster ``name``: its processes, namespaces, links, hosts files and state file.

    Idempotent; returns the namespaces it removed.
    """
    cluster = load(name)
    existing = set(netns.list_namespaces(f"{netns.PREFIX}{name}-"))
    found = set(existing)
    if cluster is not None:  # also clears /etc/netns folders of namespaces already gone
        found |= {h.ns for h in cluster.hosts} | {cluster.bridge_ns}
    for ns in sorted(found):
        netns.delete_namespace(ns)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(state_path(name))
    return sorted(found & existing)


def status(name: str, as_json: bool) -> int:
    """Print the cluster's layout and health; 0 if it is up and whole, 1 otherwise."""
    cluster = load(name)
    present = set(netns.list_namespaces(f"{netns.PREFIX}{name}-"))
    if cluster is None:
        if present:
            print(f"cluster {name!r}: no state file, but leftovers {sorted(present)}: run down")
        else:
            print(f"cluster {name!r} is not up")
        return 1
    rows = []
    for h in cluster.hosts:
        ok = h.ns in present and cluster.bridge_ns in present
        rows.append(
            {
                "host": h.index,
                "namespace": h.ns,
                "interface": h.ifname,
                "address": h.address,
                "up": ok,
                "send_rate": netns.qdisc_rate(h.ns, h.ifname) if ok else "",
                "receive_rate": netns.qdisc_rate(cluster.bridge_ns, h.port) if ok else "",
            }
        )
    whole = all(r["up"] for r in rows)
    if as_json:
        bandwidth = netns.format_rate(cluster.rate_bits)
        report = {"name": name, "bandwidth": bandwidth, "subnet": cluster.subnet}
        print(json.dumps({**report, "whole": whole, "hosts": rows}, indent=2))
        return 0 if whole else 1
    print(
        f"cluster {name!r}: {len(rows)} hosts on {cluster.subnet}, "
        f"{netns.format_rate(cluster.rate_bits)} per host each way, switch {cluster.bridge_ns}"
    )
    for r in rows:
        state = f"up  send {r['send_rate']}  receive {r['receive_rate']}" if r["up"] else "MISSING"
        print(
            f"  h{r['host']}  {r['address']:<15} {r['namespace']:<14} {r['interface']:<6} {state}"
        )
    if not whole:
        print(f"cluster {name!r} is broken: `disttrain cluster down --name {name}`, then up again")
    return 0 if whole else 1


def _require(name: str) -> Cluster:
    cluster = load(name)
    if cluster is None:
        raise UsageError(f"cluster {name!r} is not up: `disttrain cluster up --hosts N` first")
    missing = {h.ns for h in cluster.hosts} - set(netns.list_namespaces(cluster.prefix))
    if missing:
        raise UsageError(f"cluster {name!r} is broken ({sorted(missing)} missing): down, then up")
    return cluster


def add_arguments(parser: argparse.ArgumentParser, parser_class: type) -> None:
    """The ``cluster`` verbs and their flags."""
    verbs: Any = parser.add_subparsers(dest="verb", required=True, parser_class=parser_class)

    def verb(name: str, help_text: str) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--name", default=DEFAULT_NAME, help="which cluster (default: main)")
        return p

    p = verb("up", "create H hosts (network namespaces) joined by a shaped bridge")
    p.add_argument("--hosts", type=int, required=True, help="number of hosts")
    p.add_argument("--bandwidth", required=True, help="each host's link rate, e.g. 1gbit")
    p.add_argument("--subnet", default=DEFAULT_SUBNET, help="private IPv4 subnet of the hosts")
    p = verb("down", "remove the cluster and anything it left behind (idempotent)")
    p = verb("status", "show the hosts, their addresses and shaped rates")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = verb("run", "run CMD once per host; `disttrain train` becomes a multi-node job")
    p.add_argument("--port", type=int, default=29400, help="rendezvous port on host 0")
    p.add_argument("--timeout", type=float, default=0.0, help="kill all nodes after S seconds")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    p = verb("measure", "measure TCP throughput and round trip from host A to host B")
    p.add_argument("--src", type=int, default=0, help="sending host")
    p.add_argument("--dst", type=int, default=1, help="receiving host")
    p.add_argument("--seconds", type=float, default=1.0, help="transfer about this long")


def main(ns: argparse.Namespace) -> int:
    """Dispatch a parsed ``disttrain cluster VERB`` command."""
    _check_name(ns.name)
    try:
        if ns.verb == "up":
            cluster = plan(ns.name, ns.hosts, ns.bandwidth, ns.subnet)
            up(cluster)
            return status(cluster.name, as_json=False)
        if ns.verb == "run":
            from disttrain.launch import cluster_run

            cmd = ns.cmd[1:] if ns.cmd[:1] == ["--"] else ns.cmd
            if not cmd:
                raise UsageError("cluster run needs a command: disttrain cluster run -- CMD ...")
            if ns.timeout < 0 or not 0 < ns.port < 65536:
                raise UsageError("cluster run: --timeout must be >= 0 and --port in 1..65535")
            netns.check_tools()
            return cluster_run.run(_require(ns.name), cmd, ns.port, ns.timeout)
        netns.check_tools()
        if ns.verb == "down":
            removed = down(ns.name)
            print(
                f"removed {', '.join(removed)}"
                if removed
                else f"cluster {ns.name!r}: nothing to remove"
            )
            return 0
        if ns.verb == "status":
            return status(ns.name, ns.json)
        from disttrain.launch import linkprobe

        cluster = _require(ns.name)
        n = len(cluster.hosts)
        if not (0 <= ns.src < n and 0 <= ns.dst < n and ns.src != ns.dst):
            raise UsageError(f"--src and --dst must be two different hosts in 0..{n - 1}")
        if not 0 < ns.seconds <= 60:
            raise UsageError("--seconds must be in (0, 60]")
        result = linkprobe.measure(cluster.hosts[ns.src], cluster.hosts[ns.dst],
                                   cluster.rate_bits, ns.seconds)  # fmt: skip
        print(linkprobe.describe(result, cluster.rate_bits))
        return 0
    except netns.IpError as exc:
        raise UsageError(str(exc)) from None
