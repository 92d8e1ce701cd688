"""``disttrain cluster up|down|status|run|measure``: the sub-command's flags and dispatch."""

from __future__ import annotations

import argparse
from typing import Any

from disttrain.cluster import linkprobe, netns
from disttrain.cluster import run as cluster_run
from disttrain.cluster.hosts import (
    DEFAULT_NAME,
    DEFAULT_SUBNET,
    check_name,
    down,
    plan,
    require,
    status,
    up,
)
from disttrain.comm.errors import UsageError

__all__ = ["add_arguments", "run", "run_args"]


def run_args(name: str, timeout: float, port: int | None = None) -> list[str]:
    """The arguments of ``disttrain cluster run`` on cluster ``name``, up to the ``--`` the
    command follows (benchmarks start it through :mod:`disttrain.launch.commands`)."""
    return [
        "cluster",
        "run",
        "--name",
        name,
        *(["--port", str(port)] if port is not None else []),
        "--timeout",
        f"{timeout:g}",
        "--",
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``cluster`` verbs and their flags."""
    verbs: Any = parser.add_subparsers(dest="verb", required=True, parser_class=type(parser))

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


def run(ns: argparse.Namespace, argv: list[str]) -> int:
    """Dispatch a parsed ``disttrain cluster VERB`` command."""
    del argv
    check_name(ns.name)
    try:
        if ns.verb == "up":
            cluster = plan(ns.name, ns.hosts, ns.bandwidth, ns.subnet)
            up(cluster)
            return status(cluster.name, as_json=False)
        if ns.verb == "run":
            cmd = ns.cmd[1:] if ns.cmd[:1] == ["--"] else ns.cmd
            if not cmd:
                raise UsageError("cluster run needs a command: disttrain cluster run -- CMD ...")
            if ns.timeout < 0 or not 0 < ns.port < 65536:
                raise UsageError("cluster run: --timeout must be >= 0 and --port in 1..65535")
            netns.check_tools()
            return cluster_run.run(require(ns.name), cmd, ns.port, ns.timeout)
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
        cluster = require(ns.name)
        n = len(cluster.hosts)
        if not (0 <= ns.src < n and 0 <= ns.dst < n and ns.src != ns.dst):
            raise UsageError(f"--src and --dst must be two different hosts in 0..{n - 1}")
        if not 0 < ns.seconds <= 60:
            raise UsageError("--seconds must be in (0, 60]")
        result = linkprobe.measure(
            cluster.hosts[ns.src], cluster.hosts[ns.dst], cluster.rate_bits, ns.seconds
        )
        print(linkprobe.describe(result, cluster.rate_bits))
        return 0
    except netns.IpError as exc:
        raise UsageError(str(exc)) from None
