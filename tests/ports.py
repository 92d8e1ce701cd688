"""A TCP port for a command the test starts later (torchrun's ``--master-port``, a rendezvous
endpoint): free now, and outside the kernel's ephemeral range.

The usual trick (bind port 0, read the port, close) hands out a port from the ephemeral
range, which the kernel gives again to anything that binds port 0 or connects: gloo's
listeners and connections of the other tests running at the same time take hundreds a
second. If one takes it between the close and torchrun's bind, torchrun's static
rendezvous fails (EADDRINUSE), and its c10d rendezvous joins that socket as a store
client instead, again and again (checked 2026-11-28: a plain listener on the port received
the agent's connections), writing its protocol into another test's process. The kernel
never hands out a port below ``ip_local_port_range`` on its own, so a free one there
stays free until a test asks for it; tests pick at random, and a bind checks that none
holds it now.
"""

from __future__ import annotations

import random
import socket

__all__ = ["EPHEMERAL_LOW", "free_port"]

#: ports below this are never assigned by the kernel (bind(0), connect): Linux's default
#: net.ipv4.ip_local_port_range starts at 32768
_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
#: the lowest port tests pick from: above the well-known and most registered services
_LOWEST = 20000


def _ephemeral_low() -> int:
    try:
        with open(_RANGE) as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


EPHEMERAL_LOW = _ephemeral_low()


def free_port(host: str = "127.0.0.1") -> int:
    """A port in [20000, the ephemeral range's start) that nothing holds now."""
    high = max(_LOWEST + 1, EPHEMERAL_LOW)
    for _ in range(200):
        port = random.randrange(_LOWEST, high)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                continue  # held: another test's, or a service's
            return port
    raise RuntimeError(f"no free port in [{_LOWEST}, {high}) after 200 tries")
