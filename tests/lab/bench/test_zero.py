"""`disttrain bench zero`: found as a sub-command; bad input refused before any rank starts."""

from __future__ import annotations

import argparse
import importlib

import pytest

from disttrain.comm.errors import UsageError
from disttrain.lab.bench import benches


def test_bench_zero_is_a_sub_command_that_refuses_an_uneven_batch() -> None:
    module = importlib.import_module(benches()["zero"])
    assert (module.__doc__ or "").strip().splitlines()[0].startswith("ZeRO stages 1-3")
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    args = parser.parse_args(["--workers", "3", "--batch-size", "64"])
    with pytest.raises(UsageError, match="multiple of --workers"):
        module.run(args)
