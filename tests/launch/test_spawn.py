"""The local N-rank runner: results by rank, and every way a rank can fail named."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from disttrain.launch.spawn import RankError, WorldTimeout, run_world


def _whoami(scale: float) -> dict[str, object]:
    # an allreduce proves the ranks share one world; the tensor travels back as a copy
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return {"rank": int(os.environ["RANK"]), "size": dist.get_world_size(), "sum": t * scale}


def test_results_come_back_in_rank_order() -> None:
    out = run_world(_whoami, 3, args=(2.0,), timeout=120)
    assert [r["rank"] for r in out] == [0, 1, 2]
    assert [r["size"] for r in out] == [3, 3, 3]
    for r in out:
        assert isinstance(r["sum"], torch.Tensor) and r["sum"].tolist() == [12.0]  # (1+2+3)*2


def _raise_on(bad: int) -> int:
    dist.barrier()  # every rank has joined: none fails in init for the loss of this one
    if dist.get_rank() == bad:
        raise ValueError(f"boom on rank {bad}")
    return dist.get_rank()


def test_a_rank_that_raises_is_named_with_its_traceback() -> None:
    with pytest.raises(RankError) as err:
        run_world(_raise_on, 2, args=(1,), timeout=120)
    text = str(err.value)
    assert text.startswith("rank 1: ValueError: boom on rank 1")
    assert "Traceback" in text and "_raise_on" in text
    assert "rank 0" not in text


def _exit_on(bad: int, code: int) -> int:
    dist.barrier()  # every rank has joined: none fails in init for the loss of this one
    if dist.get_rank() == bad:
        if code < 0:
            os.kill(os.getpid(), -code)
        os._exit(code)
    return dist.get_rank()


@pytest.mark.parametrize(
    ("code", "named"), [(7, "exit code 7"), (-signal.SIGKILL, "signal SIGKILL")]
)
def test_a_rank_that_dies_is_named_with_its_exit_code_or_signal(code: int, named: str) -> None:
    with pytest.raises(RankError) as err:
        run_world(_exit_on, 3, args=(2, code), timeout=120)
    assert str(err.value) == f"rank 2 died without a result ({named})"


def _sleep_on(slow: int, pid_file: str) -> int:
    if dist.get_rank() == slow:
        Path(pid_file).write_text(str(os.getpid()))
        time.sleep(600)
    return dist.get_rank()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_rank_past_the_timeout_is_named_and_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    start = time.monotonic()
    with pytest.raises(WorldTimeout) as err:
        # 10 s: ample for rank 0 to start (import torch) and finish; a world of 2 takes ~2 s
        run_world(_sleep_on, 2, args=(1, str(pid_file)), timeout=10)
    assert time.monotonic() - start < 30
    assert str(err.value).startswith("ranks [1] still running after 10 s (finished: [0])")
    assert _gone(int(pid_file.read_text()))


def _fail_while_peer_sleeps(pid_file: str) -> None:
    if dist.get_rank() == 0:
        Path(pid_file).write_text(str(os.getpid()))
        time.sleep(600)
    while not Path(pid_file).exists():  # fail once rank 0 is surely asleep
        time.sleep(0.05)
    raise KeyError("lost")


def test_after_a_failure_the_others_are_stopped_soon(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    start = time.monotonic()
    with pytest.raises(RankError) as err:
        run_world(_fail_while_peer_sleeps, 2, args=(str(pid_file),), timeout=300, grace=1)
    assert time.monotonic() - start < 60  # not the 300 s timeout
    text = str(err.value)
    # one line per rank first (a report cut in the middle still names each), then tracebacks
    assert text.splitlines()[:3] == [
        "rank 1: KeyError: 'lost'",
        "ranks [0] still running 1 s after a failure: stopped",
        "",
    ], text
    assert "Traceback" in text.split("\n\n", 1)[1]
    assert _gone(int(pid_file.read_text()))
