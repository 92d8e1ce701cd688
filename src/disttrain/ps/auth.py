"""Optional CURVE authentication and encryption of the parameter server's sockets.

``--ps-curve-key FILE`` names a file holding one CURVE secret key (40 Z85
characters; make one with ``python -m disttrain.ps.keygen FILE``). Every process
of the job reads the same file: servers are CURVE servers with that key pair,
workers are CURVE clients with the same pair, and each server's ZAP handler
admits only that one client public key. A peer without the file can neither
complete the handshake (it cannot know the server's public key, derived from
the secret) nor pass the ZAP check (it cannot prove the client key without the
secret), so none of its frames reaches the server loop. CURVE covers only
these ZeroMQ sockets: torch.distributed's own traffic (the store, gloo) is not
authenticated and must stay on a trusted network (docs/parameter-server.md).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils import z85

from disttrain.comm.errors import UsageError

__all__ = ["ZAP_DOMAIN", "CurveKey", "read_key", "secure_client", "secure_server", "write_key"]

ZAP_DOMAIN = "disttrain-ps"
_KEY_CHARS = 40  # Z85 encoding of a 32-byte Curve25519 key


@dataclass(frozen=True)
class CurveKey:
    """The job's key pair (the public half is derived from the secret)."""

    secret: bytes
    public: bytes


def read_key(path: str) -> CurveKey:
    """The key pair from ``path``, or :class:`UsageError` saying what is wrong with the file."""
    if not zmq.has("curve"):
        raise UsageError("--ps-curve-key: this pyzmq/libzmq build has no CURVE support")
    try:
        with open(path, "rb") as fh:
            text = fh.read(4096).strip()
    except OSError as exc:
        raise UsageError(f"--ps-curve-key {path}: cannot read: {exc.strerror}") from None
    try:
        if len(text) != _KEY_CHARS:
            raise ValueError
        z85.decode(text)
        public = zmq.curve_public(text)
    except (ValueError, zmq.ZMQError):
        raise UsageError(
            f"--ps-curve-key {path}: not a CURVE secret key ({_KEY_CHARS} Z85 characters); "
            "make one with: python -m disttrain.ps.keygen FILE"
        ) from None
    return CurveKey(text, public)


def write_key(path: str) -> CurveKey:
    """Write a new secret key to ``path``, readable by its owner only."""
    public, secret = zmq.curve_keypair()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(secret + b"\n")
    return CurveKey(secret, public)


class _OneKey:
    """ZAP credentials provider: admit exactly the job's client public key."""

    def __init__(self, public: bytes) -> None:
        self.public = public

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.public  # pyzmq hands the client's key over Z85-encoded


_authenticators: dict[int, Any] = {}


def _domain(key: CurveKey) -> str:
    # one ZAP domain per key, so that servers of different keys may share a process (tests)
    return f"{ZAP_DOMAIN}-{hashlib.sha256(key.public).hexdigest()[:16]}"


def secure_server(sock: zmq.Socket[Any], key: CurveKey) -> None:
    """Make ``sock`` (before it binds) a CURVE server that admits only ``key``'s client."""
    from zmq.auth.thread import ThreadAuthenticator

    ctx = sock.context
    if id(ctx) not in _authenticators:  # one ZAP handler per context, started before any bind
        auth = ThreadAuthenticator(ctx)
        auth.start()
        _authenticators[id(ctx)] = auth
    _authenticators[id(ctx)].configure_curve_callback(
        _domain(key), credentials_provider=_OneKey(key.public)
    )
    sock.curve_server = True
    sock.curve_secretkey = key.secret
    sock.curve_publickey = key.public
    sock.zap_domain = _domain(key).encode()


def secure_client(sock: zmq.Socket[Any], key: CurveKey) -> None:
    """Make ``sock`` (before it connects) a CURVE client of the job's servers."""
    sock.curve_secretkey = key.secret
    sock.curve_publickey = key.public
    sock.curve_serverkey = key.public
