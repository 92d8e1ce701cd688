"""Network namespaces, veth links, a bridge and ``tc`` shaping, through iproute2.

The emulated cluster (:mod:`disttrain.cluster.hosts`) is built only from the
helpers here. Everything is created *inside* namespaces whose names start with
:data:`PREFIX`: a veth pair is created in the host's namespace with its peer
moved straight into the bridge's namespace, so no interface, address or route
is ever added to the machine's own network namespace, and deleting the
namespaces deletes every link (a veth pair dies with either end).

Shaping uses ``tbf`` (token bucket filter), because this kernel has no
``netem``: rates are emulated, latency and loss are not.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess

from disttrain.comm.errors import UsageError

__all__ = [
    "NETNS_ETC",
    "PREFIX",
    "IpError",
    "add_bridge",
    "add_namespace",
    "add_veth",
    "check_tools",
    "delete_namespace",
    "format_rate",
    "kill_namespace_pids",
    "list_namespaces",
    "namespace_pids",
    "parse_rate",
    "qdisc_rate",
    "shape",
    "write_hosts",
]

#: Every namespace (and /etc/netns folder) we create starts with this, so leftovers can be found.
PREFIX = "dt-"
#: ``ip netns exec NS`` bind-mounts ``/etc/netns/NS/hosts`` over ``/etc/hosts``.
NETNS_ETC = "/etc/netns"

_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?bit)(?:/s|ps)?\s*$", re.I)
_TIMEOUT = 30  # seconds for any one ip/tc call; they return in milliseconds


class IpError(RuntimeError):
    """An ``ip`` or ``tc`` command failed; the message is its first stderr line."""


def parse_rate(text: str) -> int:
    """``"100mbit"`` -> 100_000_000 bits/s (tc's decimal units: bit, kbit, mbit, gbit, tbit)."""
    m = _RATE.match(text)
    if not m:
        raise UsageError(
            f"--bandwidth {text!r} is not a rate: use a number and a unit, e.g. 100mbit, 1gbit"
        )
    bits = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if not 10**5 <= bits <= 10**12:
        raise UsageError(f"--bandwidth {text!r} is outside 100kbit..1tbit")
    return bits


def format_rate(bits: int) -> str:
    """100_000_000 -> ``"100mbit"`` (the largest unit that divides evenly)."""
    for unit, size in sorted(_UNITS.items(), key=lambda kv: -kv[1]):
        if bits % size == 0:
            return f"{bits // size}{unit}"
    return f"{bits}bit"


def check_tools() -> None:
    """Raise :class:`UsageError` unless we are root and iproute2 (``ip``, ``tc``) is installed."""
    if os.geteuid() != 0:
        raise UsageError("disttrain cluster needs root (it creates network namespaces): use sudo")
    missing = [tool for tool in ("ip", "tc", "unshare") if shutil.which(tool) is None]
    if missing:
        raise UsageError(
            f"disttrain cluster needs iproute2 and util-linux: {', '.join(missing)} not found"
        )


def _run(args: list[str], check: bool = True) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=_TIMEOUT)
    if check and proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or ["(no message)"])[0]
        raise IpError(f"`{' '.join(args)}` failed: {first}")
    return proc.stdout


def list_namespaces(prefix: str = PREFIX) -> list[str]:
    """Names of the network namespaces that start with ``prefix``."""
    out = _run(["ip", "netns", "list"])
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(prefix))


def add_namespace(ns: str) -> None:
    """Create namespace ``ns`` and bring its loopback up (gloo and the store may use it)."""
    _run(["ip", "netns", "add", ns])
    _run(["ip", "-n", ns, "link", "set", "lo", "up"])


def add_bridge(ns: str, bridge: str) -> None:
    """A Linux bridge (the emulated switch) inside namespace ``ns``."""
    _run(["ip", "-n", ns, "link", "add", bridge, "type", "bridge"])
    _run(["ip", "-n", ns, "link", "set", bridge, "addrgenmode", "none"])
    _run(["ip", "-n", ns, "link", "set", bridge, "up"])


def add_veth(ns: str, ifname: str, address: str, bridge_ns: str, port: str, bridge: str) -> None:
    """A cable from host ``ns`` (``ifname``, ``address``/prefix) to ``bridge`` in ``bridge_ns``.

    The pair is created inside ``ns`` and its peer moved straight into
    ``bridge_ns`` in the same call: it never appears in the machine's namespace.
    """
    _run(
        [
            "ip",
            "-n",
            ns,
            "link",
            "add",
            ifname,
            "type",
            "veth",
            "peer",
            "name",
            port,
            "netns",
            bridge_ns,
        ]
    )
    # No IPv6 link-local addresses: a host's only addresses are loopback and ``address``,
    # so a listener on "::" or "0.0.0.0" there is reachable on the private subnet only.
    _run(["ip", "-n", ns, "link", "set", ifname, "addrgenmode", "none"])
    _run(["ip", "-n", bridge_ns, "link", "set", port, "addrgenmode", "none"])
    _run(["ip", "-n", bridge_ns, "link", "set", port, "master", bridge, "up"])
    _run(["ip", "-n", ns, "addr", "add", address, "dev", ifname])
    _run(["ip", "-n", ns, "link", "set", ifname, "up"])


def shape(ns: str, dev: str, rate_bits: int) -> None:
    """Limit what ``dev`` in ``ns`` *sends* to ``rate_bits``/s with a token bucket (tbf).

    burst: 1 ms of traffic at the rate (>= 64 KiB, so a 64 KiB GSO segment fits
    and the kernel's timer granularity does not cap the rate); queue: 50 ms at
    the rate (>= 256 KiB), deep enough for TCP to fill the pipe, shallow enough
    to add little queueing delay.
    """
    rate_bytes = rate_bits // 8
    burst = max(64 * 1024, rate_bytes // 1000)
    limit = max(256 * 1024, rate_bytes // 20)
    _run(
        [
            "tc",
            "-n",
            ns,
            "qdisc",
            "replace",
            "dev",
            dev,
            "root",
            "tbf",
            "rate",
            f"{rate_bits}bit",
            "burst",
            str(burst),
            "limit",
            str(limit),
        ]
    )


def qdisc_rate(ns: str, dev: str) -> str:
    """The rate of ``dev``'s root tbf as tc prints it (e.g. ``"1Gbit"``), or ``""`` if none."""
    out = _run(["tc", "-n", ns, "qdisc", "show", "dev", dev], check=False)
    m = re.search(r"\btbf\b.*?\brate (\S+)", out)
    return m.group(1) if m else ""


def write_hosts(ns: str, entries: list[tuple[str, str]]) -> None:
    """``/etc/netns/NS/hosts``: what ``/etc/hosts`` reads inside ``ip netns exec NS``.

    Each emulated host resolves its own hostname (and its peers') to its
    private address, as on a real cluster; torch's c10d rendezvous relies on
    that to decide which node hosts the store.
    """
    folder = os.path.join(NETNS_ETC, ns)
    os.makedirs(folder, exist_ok=True)
    lines = ["127.0.0.1 localhost", *(f"{addr} {name}" for addr, name in entries)]
    # The TCPStore listens on "::", so its peers show up as ::ffff:a.b.c.d; without
    # these names c10d's reverse lookup falls through to DNS and warns on every connection.
    lines += [f"::ffff:{addr} {name}" for addr, name in entries]
    with open(os.path.join(folder, "hosts"), "w") as fh:
        fh.write("\n".join(lines) + "\n")


def namespace_pids(ns: str) -> list[int]:
    """Processes that live in namespace ``ns`` (none if it does not exist)."""
    out = _run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def kill_namespace_pids(ns: str) -> int:
    """SIGKILL every process in ``ns`` (a namespace outlives ``ip netns del`` while one runs)."""
    pids = namespace_pids(ns)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def delete_namespace(ns: str) -> None:
    """Delete ``ns`` (with its links) and its ``/etc/netns`` folder; no error if absent."""
    kill_namespace_pids(ns)
    _run(["ip", "netns", "del", ns], check=False)
    remove_etc_folder(ns)


def remove_etc_folder(ns: str) -> None:
    """Remove ``ns``'s ``/etc/netns`` folder (its hosts file), if left; no error if absent."""
    folder = os.path.join(NETNS_ETC, ns)
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(NETNS_ETC)  # only if empty: someone else may keep files there
