"""The O_DIRECT writer: every byte where it belongs, the page cache bypassed where it can be."""

from __future__ import annotations

import errno
import fcntl
import os

import pytest
import torch

from disttrain.checkpoint import direct


def _write(path: str, pieces: list[bytes]) -> object:
    with direct._DirectFileSystem().create_stream(path, "wb") as stream:
        for piece in pieces:
            assert stream.write(memoryview(piece)) == len(piece)
        told = stream.tell()
        kind = type(stream)
        flags = fcntl.fcntl(stream.fileno(), fcntl.F_GETFL)
    assert told == sum(map(len, pieces))
    return kind, flags


def test_pieces_across_blocks_land_byte_for_byte_and_the_file_has_its_length(tmp_path) -> None:
    rng = torch.Generator().manual_seed(0)
    # lengths that end inside a block, exactly on one, and span several
    sizes = [1, 4095, direct.BLOCK - 4096, 4096, 3 * direct.BLOCK + 17, 0, 5]
    pieces = [
        torch.randint(0, 256, (n,), dtype=torch.uint8, generator=rng).numpy().tobytes()
        for n in sizes
    ]
    path = str(tmp_path / "part.distcp")
    kind, flags = _write(path, pieces)
    if kind is not direct.DirectStream:
        pytest.skip("this file system refuses O_DIRECT")
    assert flags & os.O_DIRECT  # the page cache is not in the way
    with open(path, "rb") as fh:
        assert fh.read() == b"".join(pieces)  # no padding left at the end


def test_a_file_system_refusing_o_direct_gets_an_ordinary_file(tmp_path, monkeypatch) -> None:
    real_open = os.open

    def refusing(path: str, flags: int, *args: int) -> int:
        if flags & os.O_DIRECT:  # as a file system without it answers
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing)
    path = str(tmp_path / "part.distcp")
    kind, flags = _write(path, [b"abc", b"def" * 5000])
    assert kind is not direct.DirectStream and not flags & os.O_DIRECT
    with open(path, "rb") as fh:
        assert fh.read() == b"abc" + b"def" * 5000


def test_a_device_refusing_a_4_kib_aligned_write_gets_it_through_the_page_cache(
    tmp_path, monkeypatch
) -> None:
    real_write = os.write
    refused = []

    def picky(fd: int, data: object) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:  # as a 64 KiB-block device would
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", picky)
    path = str(tmp_path / "part.distcp")
    pieces = [b"x" * (direct.BLOCK + 10), b"yz"]
    kind, _ = _write(path, pieces)
    if kind is not direct.DirectStream:
        pytest.skip("this file system refuses O_DIRECT")
    assert refused  # the O_DIRECT write was tried, then the flag dropped
    with open(path, "rb") as fh:
        assert fh.read() == b"".join(pieces)


def test_two_files_open_at_once_in_one_thread_do_not_share_a_buffer(tmp_path) -> None:
    fs = direct._DirectFileSystem()
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with fs.create_stream(a, "wb") as sa, fs.create_stream(b, "wb") as sb:
        sa.write(b"A" * 5000)
        sb.write(b"B" * 7000)
    with open(a, "rb") as fa, open(b, "rb") as fb:
        assert fa.read() == b"A" * 5000 and fb.read() == b"B" * 7000
