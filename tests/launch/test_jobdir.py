"""Job folders carry their owner; a sweep removes those of dead owners only."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from disttrain.comm.procstat import start_time
from disttrain.launch import jobdir


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_folder_is_named_for_its_owner_and_private(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    folder = Path(jobdir.make("job"))
    me = os.getpid()
    assert folder.parent == tmp_path
    assert folder.name.startswith(f"disttrain-job-{me}.{start_time(me)}-")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert jobdir.sweep(str(tmp_path)) == []  # its owner lives: kept


def test_the_sweep_removes_dead_owners_folders_and_nothing_else(tmp_path: Path) -> None:
    me, dead = os.getpid(), _dead_pid()
    gone = tmp_path / f"disttrain-job-{dead}.123-abc"
    reused = tmp_path / f"disttrain-run-{me}.1-abc"  # our pid, another start: a dead owner
    live = tmp_path / f"disttrain-world-{me}.{start_time(me)}-abc"
    other = tmp_path / "disttrain-job-oldstyle"  # no owner in the name: left alone
    for folder in (gone, reused, live, other):
        (folder / "logs").mkdir(parents=True)
    target = tmp_path / "kept"
    target.mkdir()
    link = tmp_path / f"disttrain-job-{dead}.9-link"
    link.symlink_to(target)  # never followed, never removed
    removed = jobdir.sweep(str(tmp_path))
    assert sorted(removed) == sorted([gone.name, reused.name])
    assert live.is_dir() and other.is_dir() and link.is_symlink() and target.is_dir()
