"""`disttrain bench zero-equivalence`: bad input refused before any rank starts; a small
matrix (mlp, sgd, 2 workers, 3 steps) runs, prints its row and meets 1e-5."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import pytest

from disttrain.comm.errors import UsageError
from disttrain.lab.bench import benches
from tests import zygote


def _args(*argv: str) -> argparse.Namespace:
    module = importlib.import_module(benches()["zero-equivalence"])
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_batch_that_a_world_size_does_not_divide_is_refused() -> None:
    module = importlib.import_module(benches()["zero-equivalence"])
    with pytest.raises(UsageError, match=r"multiple of --workers \[5\]"):
        module.run(_args("--workers", "1,5", "--batch-size", "24"))


@pytest.mark.timeout(200)
def test_a_small_matrix_runs_and_meets_the_tolerance(tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    cmd = [
        sys.executable,
        "-m",
        "disttrain",
        "bench",
        "zero-equivalence",
        "--workers",
        "2",
        "--models",
        "mlp",
        "--optimizers",
        "sgd",
        "--steps",
        "3",
        "--json",
        str(out),
    ]
    done = zygote.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["model"], row["optimizer"], row["workers"]) == ("mlp", "sgd", 2)
    for name in ("allreduce", "zero-1", "zero-2", "zero-3"):
        assert row[name]["vs_one_process"]["max"] <= 1e-5  # the tolerance the issue asks for
    assert "1 rows, 3 ZeRO cells" in done.stdout
