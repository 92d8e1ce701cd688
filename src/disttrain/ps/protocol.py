"""The parameter-server wire format: a fixed binary header, then the raw bytes of one tensor.

Every message is a ZeroMQ multipart message of two frames, as in ps-lite
(MXNet, BytePS): a 32-byte header packed with :mod:`struct`, then the payload.
Nothing is pickled: tensors travel as their raw little-endian bytes, text
(errors, statistics) as UTF-8 JSON. A receiver trusts nothing: every field is
checked by :func:`decode` before a byte of the payload is interpreted.

    offset  size  field
    0       2     magic b"PS"
    2       1     protocol version
    3       1     message type (MsgType)
    4       1     flags (FLAG_STOP: the job's work is done, stop after this step;
                  FLAG_DROPPED, on an ERROR: the worker was dropped as lost, for good)
    5       1     dtype code (DTYPES), 0 for a payload that is not a tensor
    6       2     shard index
    8       4     worker index
    12      8     clock (a worker's step number in a PUSH or SKIP, its steps in a HELLO, a
                  shard's version in a reply)
    20      8     payload length in bytes
    28      4     learning rate (float32) of a PUSH: the worker's scheduled rate (0: server's)
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass

import torch

__all__ = [
    "DTYPES",
    "FLAG_DROPPED",
    "FLAG_STOP",
    "HEADER",
    "Header",
    "MsgType",
    "ProtocolError",
    "decode",
    "decode_tensor",
    "encode",
    "encode_tensor",
]

MAGIC = b"PS"
VERSION = 1
HEADER = struct.Struct("<2sBBBBHIQQf")
FLAG_STOP = 1
#: an ERROR's: the server dropped this worker as lost and does not take it back
FLAG_DROPPED = 2


class MsgType(enum.IntEnum):
    """What a message asks for (worker -> server) or answers (server -> worker)."""

    HELLO = 1  # a worker joins; answered by WEIGHTS
    PUSH = 2  # a gradient for the shard; answered by WEIGHTS when the mode allows
    PULL = 3  # the current weights, now
    WEIGHTS = 4  # the shard's weights; clock = the shard's version
    DONE = 5  # the worker finished; answered by WEIGHTS then STATS once all are done
    HEARTBEAT = 6  # "still alive" (payload: "HOST PID START" of its process); never answered
    STATS = 7  # the server's figures, UTF-8 JSON
    ERROR = 8  # the request was refused; UTF-8 text
    SKIP = 9  # the worker skipped step ``clock`` (an agreed fp16 overflow); answered by WEIGHTS


#: dtype codes on the wire; 0 means "not a tensor" (text, JSON or empty).
DTYPES: dict[int, torch.dtype] = {
    1: torch.float32,
    2: torch.float64,
    3: torch.float16,
    4: torch.bfloat16,
}
_CODES = {v: k for k, v in DTYPES.items()}


class ProtocolError(ValueError):
    """A frame that breaks the protocol: the message says which rule."""


@dataclass(frozen=True)
class Header:
    """The decoded fixed header of one message."""

    type: MsgType
    shard: int
    worker: int
    clock: int
    dtype: int = 0
    length: int = 0
    flags: int = 0
    lr: float = 0.0

    def pack(self) -> bytes:
        return HEADER.pack(
            MAGIC,
            VERSION,
            int(self.type),
            self.flags,
            self.dtype,
            self.shard,
            self.worker,
            self.clock,
            self.length,
            self.lr,
        )


def encode(
    type: MsgType,
    shard: int,
    worker: int,
    clock: int,
    payload: bytes | memoryview = b"",
    dtype: int = 0,
    flags: int = 0,
    lr: float = 0.0,
) -> list[bytes | memoryview]:
    """The frames of one message: ``[header, payload]``."""
    length = memoryview(payload).nbytes
    return [Header(type, shard, worker, clock, dtype, length, flags, lr).pack(), payload]


def encode_tensor(
    type: MsgType,
    shard: int,
    worker: int,
    clock: int,
    tensor: torch.Tensor,
    flags: int = 0,
    lr: float = 0.0,
) -> list[bytes | memoryview]:
    """A message carrying ``tensor``'s raw bytes ."""
    if tensor.dtype not in _CODES:
        raise ProtocolError(f"dtype {tensor.dtype} cannot be sent; use one of {list(_CODES)}")
    t = tensor.detach().contiguous().cpu().view(-1)
    # bfloat16 has no numpy twin: send its bytes through an int16 view
    raw = t.view(torch.int16) if t.dtype in (torch.bfloat16, torch.float16) else t
    payload = raw.numpy().data.cast("B")
    return encode(type, shard, worker, clock, payload, _CODES[t.dtype], flags, lr)


def decode(frames: list[bytes]) -> tuple[Header, bytes]:
    """Check and split ``[header, payload]``; :class:`ProtocolError` names the broken rule."""
    if len(frames) != 2:
        raise ProtocolError(f"expected 2 frames (header, payload), got {len(frames)}")
    raw, payload = frames
    if len(raw) != HEADER.size:
        raise ProtocolError(f"header is {len(raw)} bytes, expected {HEADER.size}")
    magic, version, mtype, flags, dtype, shard, worker, clock, length, lr = HEADER.unpack(raw)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}")
    if version != VERSION:
        raise ProtocolError(f"protocol version {version}, expected {VERSION}")
    try:
        kind = MsgType(mtype)
    except ValueError:
        raise ProtocolError(f"unknown message type {mtype}") from None
    if dtype and dtype not in DTYPES:
        raise ProtocolError(f"unknown dtype code {dtype}")
    if not (lr >= 0.0 and math.isfinite(lr)):
        raise ProtocolError(f"learning rate {lr} is not a finite non-negative number")
    if length != len(payload):
        raise ProtocolError(f"header says {length} payload bytes, frame holds {len(payload)}")
    return Header(kind, shard, worker, clock, dtype, length, flags, lr), payload


def decode_tensor(header: Header, payload: bytes, expect: torch.dtype, numel: int) -> torch.Tensor:
    """The payload as a 1-D tensor, checked against the dtype and size the receiver expects."""
    if header.dtype not in DTYPES or DTYPES[header.dtype] != expect:
        got = DTYPES.get(header.dtype, f"code {header.dtype}")
        raise ProtocolError(f"dtype {got}, expected {expect}")
    itemsize = torch.empty((), dtype=expect).element_size()
    if len(payload) != numel * itemsize:
        raise ProtocolError(
            f"{len(payload)} bytes hold {len(payload) / itemsize:g} elements, expected {numel}"
        )
    if numel == 0:
        return torch.empty(0, dtype=expect)
    if expect in (torch.bfloat16, torch.float16):
        return torch.frombuffer(bytearray(payload), dtype=torch.int16).view(expect)
    # a private copy: the frame's buffer is read-only and reused by ZeroMQ
    return torch.frombuffer(bytearray(payload), dtype=expect)
