"""The fault matrix: every strategy x kill, raise, hang and nan, through the real command.

Each case runs ``disttrain train --inject-fault KIND:rank=1:step=3 --timeout 5``
and checks that the job ends within timeout + 15 s of the fault (timed from
the line the faulty rank prints as it fires), with exit code 1 and a line
naming rank 1 (or, for an asynchronous parameter server, exit code 0 with
rank 1 dropped and the others finishing their work), and that afterwards no
process of the job is alive (so none holds a port) and /dev/shm holds nothing the job
created.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from disttrain import strategies as registered
from disttrain.collectives.shmseg import PREFIX
from disttrain.registry import load_plugins
from disttrain.train.faults import parse_fault
from tests import zygote
from tests.netcheck import Tree, alive, descendants, kill

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 5  # --timeout: a few seconds (startup skew on a loaded 2-core host stays below it)
TINY = ("--model", "mlp", "--max-steps", "6", "--no-progress", "--timeout", str(TIMEOUT))

load_plugins()  # $DISTTRAIN_PLUGINS: an out-of-tree strategy joins the matrix by itself
#: Flags that make a strategy's run here exercise more of it in 6 steps (optional: a
#: strategy without an entry runs as its first declared mode gives it).
TUNING: dict[str, tuple[str, ...]] = {
    "zero": ("--zero-stage", "2"),
    "localsgd": ("--period", "2"),
    "diloco": ("--period", "2", "--fragments", "2"),
    "hybrid": ("--workers", "4", "--dp", "2"),
}
#: Rows beyond each strategy's first mode: a path of its own (the key: strategy-label).
EXTRA: dict[str, tuple[str, ...]] = {
    "pipeline-zb1": ("--schedule", "zb1"),  # B and W apart
    "ps-async": (
        "--ps-mode",
        "async",
        "--workers",
        "3",
        "--batch-size",
        "63",
        "--ps-heartbeat",
        "0.2",
        "--ps-worker-timeout",
        "2",
    ),
}


def _first_mode(name: str) -> tuple[str, ...]:
    return next(iter(registered.get(name).settings.modes.values()))


#: row -> flags: every strategy the registry holds, in its first declared mode (ps: sync),
#: and the EXTRA rows
STRATEGIES: dict[str, tuple[str, ...]] = {
    **{
        name: ("--strategy", name, *_first_mode(name), *TUNING.get(name, ()))
        for name in registered.STRATEGIES
    },
    **{row: ("--strategy", row.split("-")[0], *flags) for row, flags in EXTRA.items()},
}

#: kind -> what rank 1's failure must say on stderr (exit code 1)
NAMED = {
    "kill": ("worker rank 1", "SIGKILL"),
    "raise": ("worker rank 1", "injected fault on rank 1 at step 3"),
    "hang": ("worker rank 1", "hung: no answer within --timeout 5 s"),
    "nan": ("worker rank 1", "rank 1 computed a non-finite gradient"),
}


#: what rank 1 made non-finite for ``nan`` (its first layer's output is poisoned in forward):
#: model parallelism stops it in forward, before its activations reach the others
def _nan_words(strategy: str) -> str:
    what = "activation" if registered.get(strategy.split("-")[0]).shares_activations else "gradient"
    return f"rank 1 computed a non-finite {what}"


#: an asynchronous parameter server drops a worker that dies or raises, and finishes
DROPPED = {"kill", "raise", "nan"}


def test_every_registered_strategy_is_in_the_matrix() -> None:
    assert {s.split("-")[0] for s in STRATEGIES} == set(registered.STRATEGIES)
    assert {parse_fault(f"{k}:rank=1") is not None for k in NAMED} == {True}


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _with_arg(text: str) -> list[int]:
    """Live processes whose command line holds ``text`` (the run's --out folder)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if text.encode() in cmdline and alive(int(entry)):
            found.append(int(entry))
    return found


def _left_behind(pids: set[int], out: Path, within: float = 0.5) -> list[int]:
    """The job's processes still alive once the kernel reaped what the agent stopped:
    polled, so the answer comes as soon as none is left (at most ``within`` seconds)."""
    deadline = time.monotonic() + within
    while True:
        left = [p for p in pids if alive(p)] + _with_arg(str(out))
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


class _Job:
    """``disttrain train`` in a subprocess; stderr read live, every pid of its tree recorded."""

    def __init__(self, args: list[str]) -> None:
        # src first; a caller's own path (an out-of-tree plug-in's folder) kept after it
        path = os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "PYTHONPATH": path}
        self.proc = zygote.popen(
            [sys.executable, "-m", "disttrain", "train", *args],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.fired_at: float | None = None
        self.tree = Tree(self.proc.pid)
        self.pids: set[int] = set(self.tree.members)  # Procs: see netcheck
        # the job's segments are named by its launcher's tag (launch/local.py): j<pid>x…
        self.shm_prefix = f"{PREFIX}j{self.proc.pid}x"
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if self.fired_at is None and "injecting fault" in line:
                self.fired_at = time.monotonic()
            self.lines.append(line)

    def wait(self, limit: float) -> tuple[int, float]:
        """Exit code, and seconds from the fault firing to the end of the job."""
        deadline = time.monotonic() + limit
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.pids.update(self.tree.poll())
            time.sleep(0.1)
        if self.proc.poll() is None:
            for p in descendants(self.proc.pid)[::-1]:
                kill(p)
            self.proc.wait()
            pytest.fail(f"the job did not end within {limit:.0f} s:\n{self.stderr}")
        ended = time.monotonic()
        self._reader.join(timeout=5)
        assert self.fired_at is not None, self.stderr
        return self.proc.returncode, ended - self.fired_at

    @property
    def stderr(self) -> str:
        return "".join(self.lines)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", list(NAMED))
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_fault_ends_the_job_naming_the_rank_and_leaves_nothing(
    strategy: str, kind: str, tmp_path: Path
) -> None:
    out = tmp_path / f"{strategy}-{kind}"
    shm_before = _shm()
    job = _Job(
        [*STRATEGIES[strategy], *TINY, "--inject-fault", f"{kind}:rank=1:step=3", "--out", str(out)]
    )
    code, seconds = job.wait(limit=240)  # start-up on a loaded 2-core machine, then the fault
    err = job.stderr
    if strategy == "ps-async" and kind in DROPPED:  # the others train on, then finish
        assert code == 0, err
        assert "rank 1: worker lost" in err, err
        summary = json.loads((out / "summary.json").read_text())
        assert [w["worker"] for w in summary["lost_workers"]] == [1]
    else:
        assert seconds <= TIMEOUT + 15, (seconds, err)
        assert code == 1, err
        last = err.strip().splitlines()[-1]  # the launcher's one line names the root cause
        named = (NAMED[kind][0], _nan_words(strategy)) if kind == "nan" else NAMED[kind]
        assert all(words in last for words in named) or (
            kind != "hang" and named[0] in last and named[1] in err
        ), err
    if kind == "nan":  # rank 1's NaN never reached another rank's checks
        assert not [r for r in (0, 2, 3) if f"rank {r} computed a non-finite" in err], err
    left = _left_behind(job.pids, out)
    assert not left, f"processes left behind: {left}"
    created = {n for n in _shm() - shm_before if n.startswith(job.shm_prefix)}
    assert not created, f"/dev/shm leftovers: {created}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("algorithm", ["shm", "hierarchical"])
def test_kill_during_shared_memory_allreduce_leaves_no_segment(
    algorithm: str, tmp_path: Path
) -> None:
    """The matrix's kill case with the gradients summed through /dev/shm segments."""
    out = tmp_path / algorithm
    shm_before = _shm()
    job = _Job(
        ["--algorithm", algorithm, *TINY, "--inject-fault", "kill:rank=1:step=3", "--out", str(out)]
    )
    code, seconds = job.wait(limit=240)
    err = job.stderr
    assert seconds <= TIMEOUT + 15, (seconds, err)
    assert code == 1 and all(w in err for w in NAMED["kill"]), err
    assert not _left_behind(job.pids, out)
    created = {n for n in _shm() - shm_before if n.startswith(job.shm_prefix)}
    assert not created, f"/dev/shm leftovers: {created}"
