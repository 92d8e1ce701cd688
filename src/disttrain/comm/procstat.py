"""What /proc says of a process: its state and start time, so a pid is never mistaken for
a later process that reused it (pids wrap in about half an hour under a test suite)."""

from __future__ import annotations

import os

__all__ = ["descendants", "ended", "start_time", "stat_fields"]


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (state first); [] if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []
    return fields if len(fields) > 19 else []


def start_time(pid: int) -> str:
    """The process's start time (clock ticks after boot, stat field 22); "" if it is gone."""
    fields = stat_fields(pid)
    return fields[19] if fields else ""


def ended(pid: int, start: str) -> bool:
    """True if the process ``pid`` that started at ``start`` is gone: no such pid, a zombie
    (killed, not yet reaped), or a later process with its pid."""
    fields = stat_fields(pid)
    return not fields or fields[0] == "Z" or fields[19] != start


def descendants(root: int) -> dict[int, str]:
    """Every live descendant of ``root`` (not ``root``): pid -> start time."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat_fields(int(entry))
            if fields:  # state, ppid, ...: field 4 of /proc/PID/stat is the parent
                children.setdefault(int(fields[1]), []).append(int(entry))
                starts[int(entry)] = fields[19]
    out: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out[pid] = starts[pid]
        todo.extend(children.get(pid, []))
    return out
