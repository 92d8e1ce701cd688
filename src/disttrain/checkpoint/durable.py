"""Durable file operations for checkpoints: what is written survives a crash or a power cut.

A file's data is durable once it is fsync'ed; its *name* (a creation, a rename, a removal)
once the folder holding it is fsync'ed too. Each function here does both, so a checkpoint
folder is either absent or complete after a crash (the layout: :mod:`disttrain.checkpoint`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any

__all__ = ["fsync_dir", "fsync_tree", "makedirs", "remove", "write_atomic"]


def fsync_dir(path: str) -> None:
    """Make the entries of folder ``path`` (creations, renames, removals) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: str) -> None:
    """fsync every file of ``folder`` (DCP's own writer syncs its data file) and the folder."""
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as fh:
            os.fsync(fh.fileno())
    fsync_dir(folder)


def makedirs(path: str) -> None:
    """``os.makedirs``, fsync'ing the parent of each folder it creates (its entry)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    makedirs(parent)
    try:
        os.mkdir(path)
    except FileExistsError:  # another rank made it first
        return
    fsync_dir(parent)


def write_atomic(path: str, write: Any) -> None:
    """Write through ``write(fh)`` to a temporary name, fsync, rename, fsync the folder."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # a failed write leaves the old file and nothing else
        raise
    fsync_dir(os.path.dirname(path))


def remove(path: str) -> None:
    """Take ``path`` out of sight in one rename, then delete it (a crash leaves no half-step)."""
    trash = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.trash")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    fsync_dir(os.path.dirname(path))
    shutil.rmtree(trash, ignore_errors=True)
