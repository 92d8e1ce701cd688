"""How the launcher names the failed rank among collateral failures."""

from __future__ import annotations

import signal

from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

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
