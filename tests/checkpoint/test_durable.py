"""The checkpoint's durable file operations: nothing half-written stays in sight."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from disttrain.checkpoint import durable


def test_write_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "COMMIT"
    path.write_bytes(b"old")
    durable.write_atomic(str(path), lambda fh: fh.write(b"new"))
    assert path.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["COMMIT"]


def test_a_failed_write_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "COMMIT"
    path.write_bytes(b"old")

    def fail(fh: object) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        durable.write_atomic(str(path), fail)
    assert path.read_bytes() == b"old"  # never replaced by a partial write
    assert os.listdir(tmp_path) == ["COMMIT"]  # and its temporary is gone


def test_makedirs_and_remove(tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b" / "c"
    durable.makedirs(str(deep))
    durable.makedirs(str(deep))  # already there: nothing to do
    (deep / "x").write_text("1")
    durable.fsync_tree(str(deep))
    durable.remove(str(tmp_path / "a"))
    assert os.listdir(tmp_path) == []  # the folder and its trash name are gone
    durable.remove(str(tmp_path / "a"))  # absent: nothing to do
