"""``--strategy ps`` end to end: sync equals allreduce, SSP's bound, softsync, faults, sockets.

Library runs go through the spawn harness (workers and servers as ranks of one
world); fault runs go through the CLI in a subprocess, as a user would, each
with a timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from tests import zygote
from tests.harness import run_world
from tests.netcheck import descendants, kill, listening_addresses

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"model": "cnn", "dataset": "digits", "batch_size": 32, "progress": False, "seed": 3}


def _train(flags: dict[str, Any]) -> dict[str, Any]:
    from disttrain import config
    from disttrain.train.trainer import train

    os.makedirs(flags["out"], exist_ok=True)
    return train(config.load(flags))


def _model(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "model.pt")  # type: ignore[no-any-return]


def test_sync_ps_matches_allreduce_within_1e_5(tmp_path: Path) -> None:
    steps = {"max_steps": 6, "optimizer": "momentum", "lr": 0.1}
    run_world(
        _train,
        2,
        args=({**SMALL, **steps, "workers": 2, "out": str(tmp_path / "ar")},),
        timeout=150,
    )
    flags = {**SMALL, **steps, "workers": 2, "strategy": "ps", "servers": 2}
    results = run_world(_train, 4, args=({**flags, "out": str(tmp_path / "ps")},), timeout=150)
    ref, got = _model(tmp_path / "ar"), _model(tmp_path / "ps")
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=1e-5, rtol=0)
    from disttrain.data import load_dataset
    from disttrain.models import build_model

    torch.manual_seed(SMALL["seed"])  # not vacuous: training moved the weights far beyond 1e-5
    init = build_model("cnn", load_dataset("digits")).state_dict()
    assert max(float((ref[k] - init[k]).abs().max()) for k in ref) > 1e-3
    summary = results[0]
    assert summary["staleness_histogram"] == {"0": 12 * 2}  # 6 steps x 2 workers x 2 shards
    assert summary["updates_applied"] == 6 and summary["clock_gap_max"] == 0
    assert [s["rank"] for s in summary["per_server"]] == [2, 3]
    assert all(s["bytes_in"] > 0 and s["bytes_out"] > 0 for s in summary["per_server"])
    # docs/parameter-server.md: pushes after the budget is spent (none in sync mode)
    assert [s["discarded_after_stop"] for s in summary["per_server"]] == [0, 0]
    assert summary["bytes_sent_by_rank"][0] > 0
    # the servers' own return values are their figures
    assert results[2]["shard"] == 0 and results[3]["shard"] == 1


def test_ssp_never_exceeds_its_bound_with_a_straggler_and_softsync_averages_s(
    tmp_path: Path,
) -> None:
    base = {**SMALL, "batch_size": 36, "workers": 3, "strategy": "ps", "max_steps": 12}
    base["straggler"] = "2:4"
    ssp = run_world(
        _train,
        4,
        args=({**base, "ps_mode": "ssp", "staleness_bound": 1, "out": str(tmp_path / "ssp")},),
        timeout=150,
    )[0]
    assert ssp["clock_gap_max"] <= 1
    assert max(int(k) for k in ssp["clock_gap_histogram"]) <= 1
    assert ssp["gradients_received"] == 36
    soft = run_world(
        _train,
        4,
        args=({**base, "ps_mode": "softsync", "softsync": 2, "out": str(tmp_path / "soft")},),
        timeout=150,
    )[0]
    assert soft["gradients_received"] == 36
    assert soft["updates_applied"] == 18  # every update is the mean of exactly 2 gradients
    fast = soft["worker_steps"]
    assert fast["0"] > fast["2"] and fast["1"] > fast["2"]  # nobody waited for the straggler


def _cli(args: list[str], out: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    cmd = [
        sys.executable,
        "-m",
        "disttrain",
        "train",
        "--strategy",
        "ps",
        "--model",
        "cnn",
        "--no-progress",
        "--batch-size",
        "32",
        "--out",
        str(out),
        *args,
    ]
    return zygote.popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_killed_worker_is_dropped_in_async_and_the_rest_finish(tmp_path: Path) -> None:
    # killed as its 1st step begins (after it said hello to the servers) of a 40-step budget
    # (120 gradients): on loaded cores the others spent the whole budget before rank 1 got
    # to a later step, once at step 4 of 20 and once at step 2 of 40 (a full make test)
    proc = _cli(
        [
            "--ps-mode",
            "async",
            "--workers",
            "3",
            "--batch-size",
            "36",
            "--max-steps",
            "40",
            "--ps-heartbeat",
            "0.2",
            "--ps-worker-timeout",
            "3",
            "--inject-fault",
            "kill:rank=1:step=1",
        ],
        tmp_path,
    )
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "rank 1: worker lost" in err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [w["worker"] for w in summary["lost_workers"]] == [1]
    assert summary["lost_workers"][0]["seconds"] > 0
    assert summary["gradients_received"] == 120  # the survivors did the dead worker's share
    assert summary["worker_steps"].get("1", 0) == 0  # it pushed nothing
    assert summary["workers"] == 2  # the end-of-run gather ran over the survivors


def test_a_killed_worker_ends_a_sync_job_with_an_error_naming_it(tmp_path: Path) -> None:
    start = time.monotonic()
    proc = _cli(
        [
            "--ps-mode",
            "sync",
            "--workers",
            "2",
            "--max-steps",
            "50",
            "--timeout",
            "30",
            "--inject-fault",
            "kill:rank=1:step=3",
        ],
        tmp_path,
    )
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 1
    assert "rank 1" in err and "SIGKILL" in err
    assert time.monotonic() - start < 200


def _rank(pid: int) -> str | None:
    """The rank of a worker process, from the name it gives itself ("disttrain r2")."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    return comm.removeprefix("disttrain r") if comm.startswith("disttrain r") else None


def test_servers_listen_on_loopback_only_and_a_dead_server_ends_the_job(tmp_path: Path) -> None:
    proc = _cli(["--ps-mode", "async", "--workers", "2", "--epochs", "50"], tmp_path)
    try:
        listening: list[tuple[str, int]] = []
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and proc.poll() is None:
            listening = listening_addresses(descendants(proc.pid))
            if listening and (tmp_path / "metrics.jsonl").exists():
                break  # training has started, so the servers are bound and serving
            time.sleep(0.3)
        assert listening, "no listening socket found: the check would prove nothing"
        assert all(addr in ("127.0.0.1", "::1") for addr, _ in listening), listening
        servers = [p for p in descendants(proc.pid) if _rank(p) == "2"]
        assert servers, "server rank 2 not found"
        for p in servers:
            kill(p)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1
    assert "rank 2" in err


def test_bad_ps_settings_are_one_line_and_exit_2(capsys: Any) -> None:
    from disttrain.cli import main

    for args, says in (
        (["--softsync", "5"], "--softsync 5 exceeds the 2 workers"),
        (["--straggler", "7:2"], "--straggler names rank 7"),
        (["--straggler", "x"], "use RANK:FACTOR"),
        (["--servers", "0"], "--servers must be positive"),
        (["--ps-mode", "async", "--precision", "fp16"], "needs --ps-mode sync"),
    ):
        assert main(["train", "--strategy", "ps", "--workers", "2", *args]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err


def test_async_reports_the_job_s_epochs_not_a_fast_worker_s_own(tmp_path: Path) -> None:
    """2 steps an epoch (600 of digits' samples a batch), --epochs 1: 2 updates in all. Worker
    1 is slow, so worker 0 (which writes the summary) runs into its own second epoch."""
    flags = {
        **SMALL,
        "batch_size": 600,
        "epochs": 1,
        "workers": 2,
        "strategy": "ps",
        "ps_mode": "async",
        "straggler": "1:4",
        "out": str(tmp_path / "a"),
    }
    summary = run_world(_train, 3, args=(flags,), timeout=150)[0]
    assert summary["worker_steps"]["0"] > 1  # a step of its second pass over the data
    assert summary["epochs"] == 1
