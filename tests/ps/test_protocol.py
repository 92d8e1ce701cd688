"""The wire format: round trips of every dtype, and every rule a bad frame can break."""

from __future__ import annotations

import pytest
import torch

from disttrain.ps.protocol import (
    FLAG_STOP,
    HEADER,
    Header,
    MsgType,
    ProtocolError,
    decode,
    decode_tensor,
    encode,
    encode_tensor,
)


def _wire(frames: list[bytes | memoryview]) -> list[bytes]:
    return [bytes(f) for f in frames]  # what a receiving socket hands over


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_tensor_round_trip_is_bit_exact(dtype: torch.dtype) -> None:
    t = torch.randn(37).to(dtype)
    header, payload = decode(_wire(encode_tensor(MsgType.PUSH, 3, 5, 123456789012, t, FLAG_STOP)))
    assert (header.type, header.shard, header.worker, header.clock) == (
        MsgType.PUSH,
        3,
        5,
        123456789012,
    )
    assert header.flags == FLAG_STOP and header.length == 37 * t.element_size()
    assert torch.equal(decode_tensor(header, payload, dtype, 37), t)


def test_header_is_fixed_size_and_text_payloads_round_trip() -> None:
    assert HEADER.size == 32
    header, payload = decode(_wire(encode(MsgType.STATS, 0, 1, 2, b'{"a": 1}')))
    assert header == Header(MsgType.STATS, 0, 1, 2, 0, 8, 0) and payload == b'{"a": 1}'


def _good() -> list[bytes]:
    return _wire(encode_tensor(MsgType.PUSH, 0, 1, 0, torch.ones(4)))


@pytest.mark.parametrize(
    ("frames", "rule"),
    [
        ([b"x"], "expected 2 frames"),
        ([b"short", b""], "header is 5 bytes"),
        ([b"XX" + _good()[0][2:], _good()[1]], "bad magic"),
        ([_good()[0][:2] + b"\x09" + _good()[0][3:], _good()[1]], "protocol version"),
        ([_good()[0][:3] + b"\x63" + _good()[0][4:], _good()[1]], "unknown message type"),
        ([_good()[0][:5] + b"\x63" + _good()[0][6:], _good()[1]], "unknown dtype"),
        ([_good()[0], _good()[1][:-1]], "header says 16 payload bytes"),
    ],
)
def test_malformed_frames_are_refused_naming_the_rule(frames: list[bytes], rule: str) -> None:
    with pytest.raises(ProtocolError, match=rule):
        decode(frames)


def test_wrong_dtype_or_size_is_refused() -> None:
    header, payload = decode(_good())
    with pytest.raises(ProtocolError, match=r"expected torch\.float64"):
        decode_tensor(header, payload, torch.float64, 4)
    with pytest.raises(ProtocolError, match="expected 5"):
        decode_tensor(header, payload, torch.float32, 5)


def test_no_pickle_on_the_wire() -> None:
    frames = _wire(encode_tensor(MsgType.PUSH, 0, 0, 0, torch.arange(3.0)))
    assert frames[1] == torch.arange(3.0).numpy().tobytes()  # raw little-endian floats
    assert not frames[0].startswith(b"\x80")  # no pickle protocol marker


def test_learning_rate_travels_in_the_header_and_must_be_finite() -> None:
    frames = _wire(encode_tensor(MsgType.PUSH, 0, 0, 0, torch.ones(2), lr=0.125))
    assert decode(frames)[0].lr == 0.125
    bad = _wire(encode_tensor(MsgType.PUSH, 0, 0, 0, torch.ones(2), lr=float("nan")))
    with pytest.raises(ProtocolError, match="learning rate"):
        decode(bad)
