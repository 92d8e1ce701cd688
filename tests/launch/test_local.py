"""How the launcher names the failed rank among collateral failures, and what it asks torch for."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.launcher.api import LaunchConfig

from disttrain.config import TrainConfig
from disttrain.launch import local, rendezvous
from disttrain.launch.local import PEER_EXIT_CODE, root_cause


def _failure(rank: int, exitcode: int) -> ProcessFailure:
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file="")


def test_the_killed_rank_is_the_root_cause_not_those_that_stopped_for_it() -> None:
    failures = {
        0: _failure(0, -signal.SIGTERM),
        1: _failure(1, -signal.SIGKILL),
        2: _failure(2, PEER_EXIT_CODE),
    }
    assert root_cause(failures)[0] == 1


def test_in_one_second_a_rank_killed_by_a_signal_comes_before_an_error_exit() -> None:
    # a parameter server SIGKILLed, a worker that exited 1 on the dead server in the same
    # agent pass (stamped to the second): the server is named, whatever the rank order
    failures = {1: _failure(1, 1), 2: _failure(2, -signal.SIGKILL)}
    failures[1].timestamp = failures[2].timestamp
    assert root_cause(failures)[0] == 2
    failures[2].timestamp += 1  # a second later: not the cause
    assert root_cause(failures)[0] == 1


def test_when_only_collateral_failures_remain_one_of_them_is_named() -> None:
    failures = {2: _failure(2, PEER_EXIT_CODE), 3: _failure(3, PEER_EXIT_CODE)}
    assert root_cause(failures)[0] in (2, 3)


def test_a_rank_that_did_not_answer_the_roll_call_is_named_as_hung() -> None:
    # rank 1 hung: ranks 0 and 2 timed out and answered; the agent then stopped 1 and 2
    failures = {
        0: _failure(0, PEER_EXIT_CODE),
        1: _failure(1, -signal.SIGTERM),
        2: _failure(2, -signal.SIGTERM),
    }
    assert root_cause(failures, {0: None, 2: None}, members=3) == (1, failures[1], True)
    # a parameter server (rank 3, beyond the workers) never answers: not a suspect
    failures[3] = _failure(3, -signal.SIGTERM)
    assert root_cause(failures, {0: None, 2: None}, members=3)[0] == 1
    # everyone answered, but a server's error named worker 2
    assert root_cause(failures, {0: 2, 1: None, 2: None}, members=3)[:3:2] == (2, True)
    # a death of its own still wins over the roll call
    failures[1] = _failure(1, -signal.SIGKILL)
    assert root_cause(failures, {0: None, 2: None}, members=3) == (1, failures[1], False)


def _launched(monkeypatch: pytest.MonkeyPatch, cfg: TrainConfig) -> LaunchConfig:
    """The LaunchConfig that ``launch`` hands torch's elastic launcher (nothing is started)."""
    seen: list[LaunchConfig] = []

    def fake(config: LaunchConfig, entrypoint: str) -> Callable[..., None]:
        seen.append(config)
        return lambda *args: None

    monkeypatch.setattr(local, "elastic_launch", fake)
    local.launch(cfg, 2, ["train"])
    return seen[0]


def test_multi_node_uses_c10d_and_passes_no_node_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    # c10d reads no "rank" from rdzv_configs (only the static backend does): it sorts
    # the nodes by host name. Passing --node-rank there would promise what it does not do.
    cfg = TrainConfig(nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29400", rdzv_id="job7")
    config = _launched(monkeypatch, cfg)
    assert config.rdzv_backend == "c10d"
    assert config.rdzv_endpoint == "10.0.0.1:29400"
    assert config.run_id == "job7"
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (2, 2, 2)
    assert "rank" not in config.rdzv_configs
    assert local.launch_config(cfg, 2, "/tmp/x").rdzv_configs == config.rdzv_configs


def test_single_host_uses_the_file_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _launched(monkeypatch, TrainConfig())
    assert config.rdzv_backend == rendezvous.BACKEND
    assert config.rdzv_endpoint == "" and config.min_nodes == config.max_nodes == 1
    assert config.rdzv_configs["store_path"].endswith("agent.store")
    assert "rank" not in config.rdzv_configs
