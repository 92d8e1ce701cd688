"""--pin-cpus: a worker is pinned to one allowed CPU, chosen by its local rank."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_each_local_rank_gets_its_own_cpu_in_turn() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    code = (
        "import os, sys; from disttrain.train.trainer import pin_to_cpu; "
        "cpu = pin_to_cpu(int(sys.argv[1])); print(cpu, sorted(os.sched_getaffinity(0)))"
    )
    for local_rank in range(len(allowed) + 1):
        out = subprocess.run(
            [sys.executable, "-c", code, str(local_rank)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
            check=True,
        ).stdout.split(maxsplit=1)
        expected = allowed[local_rank % len(allowed)]
        assert out == [str(expected), f"[{expected}]\n"]
