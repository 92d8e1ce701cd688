"""tests/ports.py: a port for a command started later, outside the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket

import pytest

from tests import ports


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    for _ in range(20):
        port = ports.free_port()
        assert 20000 <= port < ports.EPHEMERAL_LOW  # the kernel never hands these out itself
        with socket.socket() as s:  # and nothing holds it
            s.bind(("127.0.0.1", port))


def test_a_held_port_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", ports.free_port()))
        held.listen(1)
        taken = held.getsockname()[1]
        picks = iter([taken, taken, taken + 1 if taken + 1 < ports.EPHEMERAL_LOW else taken - 1])
        monkeypatch.setattr(random, "randrange", lambda low, high: next(picks))
        assert ports.free_port() != taken
