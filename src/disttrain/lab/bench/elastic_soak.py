"""Soak test of live shrink and grow: N random kill/hang events on one long allreduce job.

    disttrain bench elastic-soak [--events 50] [--seed 0] [--max-seconds 1200] [--gap 30]

Starts ``disttrain train --workers 3 --min-workers 2 --max-workers 3`` (mlp on digits,
``--timeout 3``) and, from this process, fires the events of a seeded schedule at step
boundaries (read from the job's ``metrics.jsonl``): ``kill`` sends SIGKILL, ``hang``
SIGSTOP, to the worker process of a random live launch rank other than 0 (rank 0 holds the
join point, ``OUT/join.json``, and admits joiners; a job that lost it could not grow again).
After each loss (its ``membership`` line) it starts ``disttrain train --join OUT`` and waits
for the join's line before the next event, so every regroup ends before the next event and
the job keeps 2 to 3 workers. After ``--max-seconds`` it fires nothing more and lets the
job end. Then it checks and prints: the job's exit code; every step 1..max-steps trained
exactly once (``metrics.jsonl``); ``summary.json``'s ``membership`` has one entry per
loss and per join (seconds lost each); no process whose command line names OUT is left;
no new entry in /dev/shm; with ``--reference``, the final accuracy of an undisturbed run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from disttrain.launch import commands

__all__ = ["Event", "add_arguments", "run", "schedule", "step_errors"]

KINDS = ("kill", "hang")
#: The steps after the last event: the job ends on its own after these.
TAIL = 30


@dataclass(frozen=True)
class Event:
    after: int  # fire this many steps after the last regroup of the event before
    kind: str  # "kill" (SIGKILL) or "hang" (SIGSTOP)


def schedule(seed: int, events: int, gap: int) -> list[Event]:
    """``events`` events, each ``gap`` to ``2 * gap`` steps after the regroups of the one
    before (relative: a join takes a joiner's start-up, whose steps vary), kind drawn."""
    if events < 0 or gap < 1:
        raise ValueError(f"events >= 0 and gap >= 1, got {events} and {gap}")
    rng = random.Random(seed)
    return [Event(rng.randint(gap, 2 * gap), rng.choice(KINDS)) for _ in range(events)]


def step_errors(steps: list[int], last: int) -> tuple[list[int], list[int]]:
    """The steps of 1..last missing from ``steps``, and those present more than once (or
    outside 1..last)."""
    seen: dict[int, int] = {}
    for s in steps:
        seen[s] = seen.get(s, 0) + 1
    missing = [s for s in range(1, last + 1) if s not in seen]
    repeated = sorted(s for s, n in seen.items() if n > 1 or not 1 <= s <= last)
    return missing, repeated


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gap", type=int, default=30, help="least steps between events")
    parser.add_argument(
        "--max-seconds", type=float, default=1200.0, help="fire no event after this many seconds"
    )
    parser.add_argument(
        "--steps-per-event",
        type=int,
        default=80,
        help="the job's --max-steps is events x this + 30: room for the steps "
        "trained while a joiner starts (~45 at 2 cores)",
    )
    parser.add_argument("--timeout", type=float, default=3.0, help="the job's --timeout")
    parser.add_argument("--out", default="", help="the job's folder (default: a temporary one)")
    parser.add_argument(
        "--reference", action="store_true", help="also run the job undisturbed: its final accuracy"
    )


def _procs() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, command line, RANK from the environment or "") of our processes."""
    found: dict[int, tuple[int, str, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:  # gone, or another user's
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        rank = next((e[5:].decode() for e in env if e.startswith(b"RANK=")), "")
        found[int(entry)] = (ppid, cmd, rank)
    return found


def _named(out: str) -> list[int]:
    """Live (not zombie) processes whose command line names the job's folder (this bench
    and the commands that started it left out)."""
    procs, mine, up = _procs(), [], {os.getpid()}
    pid = os.getpid()
    while pid in procs and procs[pid][0] > 1:
        pid = procs[pid][0]
        up.add(pid)
    for pid, (_, cmd, _) in procs.items():
        if out in cmd and pid not in up:
            try:
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    mine.append(pid)
            except OSError:
                pass
    return mine


class _Soak:
    def __init__(self, a: argparse.Namespace, out: str) -> None:
        self.a, self.out = a, out
        self.metrics = Path(out) / "metrics.jsonl"
        self.joiners: list[subprocess.Popen[bytes]] = []
        self.joiner_rank: dict[int, int] = {}  # joiner pid -> launch rank (its leaf's RANK)
        self.rng = random.Random(a.seed + 1)

    def lines(self) -> list[dict[str, Any]]:
        found = []
        for raw in self.metrics.read_text().splitlines() if self.metrics.exists() else []:
            with contextlib.suppress(json.JSONDecodeError):  # a line being written
                found.append(json.loads(raw))
        return found

    def done(self) -> int:
        return max((r["step"] for r in self.lines() if "loss" in r), default=0)

    def changes(self) -> list[dict[str, Any]]:
        return [r for r in self.lines() if r.get("event") == "membership"]

    def workers(self, job: int) -> dict[int, int]:
        """Launch rank -> pid of each worker (the leaf below its supervisor; joiners too)."""
        procs = _procs()
        kids: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in procs.items():
            kids.setdefault(ppid, []).append(pid)
        tree, todo = [], [job] + [j.pid for j in self.joiners if j.poll() is None]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(kids.get(pid, []))
        found = {}
        for pid in tree:
            ppid, cmd, rank = procs.get(pid, (0, "", ""))
            if rank and "disttrain" in cmd and not any(procs[k][2] for k in kids.get(pid, [])):
                found[int(rank)] = pid
        for j in self.joiners:  # a joiner outside torchrun has no RANK: its own process
            if j.poll() is None and j.pid in procs and not kids.get(j.pid):
                found[1000 + j.pid] = j.pid  # named later by its membership record
        return found

    def wait_for(self, count: int, limit: float, proc: subprocess.Popen[bytes]) -> bool:
        deadline = time.monotonic() + limit
        while len(self.changes()) < count:
            if time.monotonic() > deadline or proc.poll() is not None:
                return False
            time.sleep(0.1)
        return True

    def join(self) -> None:
        args = ["train", "--join", self.out]
        self.joiners.append(
            commands.start(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )


def _train(a: argparse.Namespace, out: str, steps: int) -> list[str]:
    """The soaked job's ``disttrain`` arguments."""
    return [
        "train",
        "--workers",
        "3",
        "--min-workers",
        "2",
        "--max-workers",
        "3",
        "--batch-size",
        "24",
        "--seed",
        str(a.seed),
        "--epochs",
        "1000",
        "--max-steps",
        str(steps),
        "--timeout",
        str(a.timeout),
        "--no-progress",
        "--out",
        out,
    ]


def run(args: argparse.Namespace) -> int:
    if args.out:
        return _soak(args, os.path.abspath(args.out))
    with tempfile.TemporaryDirectory(prefix="disttrain-soak-") as tmp:
        return _soak(args, tmp)


def _fire(soak: _Soak, job: subprocess.Popen[bytes], event: Event) -> dict[str, Any] | None:
    """One event and the regroups it causes; what happened, or None if it could not run."""
    victims = {r: p for r, p in soak.workers(job.pid).items() if r != 0}
    if not victims:
        return None
    rank = soak.rng.choice(sorted(victims))
    pid, before = victims[rank], len(soak.changes())
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL if event.kind == "kill" else signal.SIGSTOP)
    limit = 6 * soak.a.timeout + 30
    if not soak.wait_for(before + 1, limit, job):
        return {"event": event.kind, "pid": pid, "error": "no membership record of the loss"}
    lost = soak.changes()[before]
    if event.kind == "hang":  # the new rank 0 ends the hung worker by its pid
        with contextlib.suppress(ProcessLookupError):  # if still there, let it see its end
            os.kill(pid, signal.SIGCONT)
    for _ in range(3):  # a joiner may lose its place to a loss in the same window
        soak.join()
        have = len(soak.changes())
        if soak.wait_for(have + 1, limit, job) and soak.changes()[have].get("joined"):
            break
    joined = [c for c in soak.changes()[before + 1 :] if c.get("joined")]
    return {
        "event": event.kind,
        "pid": pid,
        "lost": lost.get("lost"),
        "at": lost["step"],
        "lost_s": lost.get("seconds_lost"),
        "joined": joined[0]["joined"] if joined else None,
        "join_s": joined[0].get("seconds_lost") if joined else None,
        "wall_s": round(time.monotonic() - t0, 1),
    }


def _soak(a: argparse.Namespace, out: str) -> int:
    plan = schedule(a.seed, a.events, a.gap)
    steps = max(a.steps_per_event, 2 * a.gap) * len(plan) + TAIL
    shm_before = set(os.listdir("/dev/shm"))
    soak = _Soak(a, out)
    start = time.monotonic()
    job = commands.start(_train(a, out, steps), stdout=subprocess.DEVNULL)
    fired: list[dict[str, Any]] = []
    for event in plan:
        fire_at = soak.done() + event.after
        while soak.done() < fire_at and job.poll() is None:
            time.sleep(0.05)
        if job.poll() is not None or time.monotonic() - start > a.max_seconds:
            break
        result = _fire(soak, job, event)
        if result is None:
            continue
        fired.append(result)
        print(f"event {len(fired)}: {json.dumps(result)}", flush=True)
        if "error" in result:
            break
    code = job.wait(timeout=max(120.0, steps / 2))
    joiner_codes = [j.wait(timeout=60) for j in soak.joiners]
    time.sleep(1.0)  # let the last exits settle
    return _report(a, out, steps, code, joiner_codes, fired, shm_before, start)


def _reference_run(a: argparse.Namespace, steps: int) -> None:
    """Print the final accuracy of the same job run undisturbed (3 workers, the same seed
    and steps): what the soak's accuracy is read against."""
    from disttrain.launch.commands import train_run

    ref = train_run(
        {
            "workers": 3,
            "batch_size": 24,
            "seed": a.seed,
            "epochs": 1000,
            "max_steps": steps,
            "timeout": a.timeout,
        }
    )
    print(f"undisturbed run (3 workers): final accuracy {ref['final_accuracy']}")


def _report(
    a: argparse.Namespace,
    out: str,
    steps: int,
    code: int,
    joiner_codes: list[int],
    fired: list[dict[str, Any]],
    shm_before: set[str],
    start: float,
) -> int:
    lines = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    missing, repeated = step_errors([r["step"] for r in lines if "loss" in r], steps)
    summary = json.loads((Path(out) / "summary.json").read_text()) if code == 0 else {}
    changes = summary.get("membership", [])
    left = [c for c in changes if c.get("lost")]
    joined = [c for c in changes if c.get("joined")]
    left_over = _named(out)
    shm_new = sorted(set(os.listdir("/dev/shm")) - shm_before)
    kills = sum(f["event"] == "kill" for f in fired)
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(
        f"events fired: {len(fired)} of {a.events} ({kills} kill, {len(fired) - kills} hang) "
        f"in {time.monotonic() - start:.0f} s"
    )
    print(f"job exit code: {code}; joiners' exit codes: {sorted(set(joiner_codes))}")
    # a step only some survivors finished has its line too (the one ahead hands it over)
    print(f"steps 1..{steps}: missing {missing or 'none'}, repeated {repeated or 'none'}")
    lost_s = [c["seconds_lost"] for c in left]
    join_s = [c["seconds_lost"] for c in joined]
    print(
        f"membership: {len(left)} left (seconds lost max {max(lost_s, default=0):.2f}), "
        f"{len(joined)} joined (max {max(join_s, default=0):.2f} s), {len(changes)} entries"
    )
    print(f"processes naming the job's folder left: {left_over or 'none'}")
    print(f"new /dev/shm entries: {shm_new or 'none'}")
    accuracy = summary.get("final_accuracy")
    print(f"final accuracy: {accuracy}")
    if a.reference:
        _reference_run(a, steps)
    beaten = 1 if fired and fired[-1].get("joined") is None else 0  # the job ended first
    ok = (
        code == 0
        and not missing
        and not repeated
        and len(left) == len(fired)
        and len(joined) >= len(fired) - beaten
        and not left_over
        and not shm_new
    )
    print("soak: PASS" if ok else "soak: FAIL")
    return 0 if ok else 1
