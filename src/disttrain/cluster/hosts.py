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

import contextlib
import ipaddress
import json
import os
import re
import signal
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from types import FrameType

from disttrain.cluster import netns
from disttrain.comm.errors import UsageError

__all__ = [
    "Cluster",
    "Host",
    "down",
    "load",
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


def check_name(name: str) -> None:
    if not _NAME.match(name):
        raise UsageError(
            f"--name {name!r}: use 1-8 lowercase letters or digits, starting with a letter"
        )


def plan(name: str, hosts: int, bandwidth: str, subnet: str = DEFAULT_SUBNET) -> Cluster:
    """Check the request and lay out the cluster (nothing is created)."""
    check_name(name)
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


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP for the duration, then act on the first one caught.

    For starting a child and recording it as one step: a KeyboardInterrupt raised inside
    ``subprocess.Popen`` leaves a started child that the caller never learnt of, so its
    clean-up cannot stop it (seen: a node left running in its namespace after Ctrl-C)."""
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    if caught:
        if caught[0] == signal.SIGINT:
            raise KeyboardInterrupt
        raise _Terminated(signal.Signals(caught[0]).name)


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
        if ns in existing:
            netns.delete_namespace(ns)
        else:  # never created, or gone: only a hosts folder may be left (no `ip` to run:
            # an `up` interrupted early names 41 namespaces; 82 `ip` calls took > 60 s loaded)
            netns.remove_etc_folder(ns)
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


def require(name: str) -> Cluster:
    cluster = load(name)
    if cluster is None:
        raise UsageError(f"cluster {name!r} is not up: `disttrain cluster up --hosts N` first")
    missing = {h.ns for h in cluster.hosts} - set(netns.list_namespaces(cluster.prefix))
    if missing:
        raise UsageError(f"cluster {name!r} is broken ({sorted(missing)} missing): down, then up")
    return cluster
