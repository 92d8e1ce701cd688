"""L0: DCP's file writer with its files written around the page cache (``O_DIRECT``).

A checkpoint's bytes are written once and read, if ever, after a crash: keeping them in
the page cache buys nothing, and costs the writer thread's CPU, which on 2 cores that
both train is taken from training. Through the page cache every page of the file is
allocated (on a VM that returns free memory to its host, faulted in there too), copied
into, written back at fsync and freed again when its step drops out; with ``O_DIRECT``
only a copy into a bounce buffer that is kept from write to write remains, and the device
reads from that. What it changed in a training run (the async overhead from 5.6-6.2 % to
2.5-4.3 %): ``disttrain bench checkpoint-overhead``, RESULTS "Checkpoints".

``O_DIRECT`` wants the memory, the file offset and the length aligned to the device's
block: each write goes through the bounce buffer (page-aligned, written in whole
4 MiB blocks), the last block padded and the file then truncated to its length. Where a
file system refuses ``O_DIRECT`` (EINVAL: tmpfs before Linux 6.6, some network file
systems), the file is written as before. Durability stays the caller's: a write returns
once the device has the data, which is durable (the device's cache flushed, the file's
length and name recorded) once the file and its folder are fsync'ed
(:func:`~disttrain.checkpoint.durable.fsync_tree`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import mmap
import os
import threading
from collections.abc import Generator
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

__all__ = ["BLOCK", "DirectStream", "writer"]

BLOCK = 4 << 20  # bytes per write: a multiple of any device block (512 B, 4 KiB)
_ALIGN = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)  # Linux's; elsewhere every file goes through the cache
_local = threading.local()  # each thread's idle bounce buffers, kept: no page faults


def _take() -> memoryview:
    """A bounce buffer no open stream uses (the writer thread's one, after the first save)."""
    free: list[memoryview] = _local.__dict__.setdefault("free", [])
    return free.pop() if free else memoryview(mmap.mmap(-1, BLOCK))  # page-aligned


def _give_back(buf: memoryview) -> None:
    _local.__dict__.setdefault("free", []).append(buf)


class DirectStream(io.RawIOBase):
    """A write-only file written with ``O_DIRECT`` in whole blocks through a bounce buffer;
    ``flush`` writes nothing (only whole blocks can be), ``close`` writes the rest."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd, self._buf, self._fill, self._done = fd, _take(), 0, 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n, at = len(view), 0
        while at < n:
            take = min(BLOCK - self._fill, n - at)
            self._buf[self._fill : self._fill + take] = view[at : at + take]
            self._fill += take
            at += take
            if self._fill == BLOCK:
                self._drain(BLOCK)
        return n

    def _drain(self, length: int) -> None:
        # os.write may write less than asked (a signal): an O_DIRECT write of a block
        # multiple is retried from where it stopped, still aligned
        at = 0
        while at < length:
            try:
                at += os.write(self._fd, self._buf[at:length])
            except OSError as exc:  # a device whose block is larger than 4 KiB refuses it
                flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
                if exc.errno != errno.EINVAL or not flags & _O_DIRECT:
                    raise
                fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~_O_DIRECT)  # the page cache
        self._done += self._fill
        self._fill = 0

    def tell(self) -> int:
        return self._done + self._fill

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._fill:
                size = self._done + self._fill
                padded = -(-self._fill // _ALIGN) * _ALIGN
                self._buf[self._fill : padded] = bytes(padded - self._fill)
                self._drain(padded)
                os.ftruncate(self._fd, size)  # the padding off again
        finally:
            os.close(self._fd)
            _give_back(self._buf)
            super().close()


def _open_direct(path: str) -> io.IOBase:
    """``path`` for writing with ``O_DIRECT``, or an ordinary file where it is refused (a
    file system without it answers EINVAL; a system without the flag gets one too)."""
    if _O_DIRECT:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_DIRECT, 0o666)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
        else:
            return DirectStream(fd)
    return open(path, "wb")  # closed by create_stream


class _DirectFileSystem(FileSystem):
    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        stream = _open_direct(str(Path(path)))
        try:
            yield stream
        finally:
            stream.close()


def writer(folder: str) -> FileSystemWriter:
    """DCP's file writer for ``folder``, its files written with ``O_DIRECT``; it syncs no
    file itself (the caller fsyncs the folder's files once all are written)."""
    w = FileSystemWriter(folder, sync_files=False)
    w.fs = _DirectFileSystem()
    return w
