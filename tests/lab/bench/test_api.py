"""`disttrain bench api`: a tiny run times dt.distribute against DDP and sleepy data against
the same without the sleep, on the same training, and prints ratios that parse; bad input is
one line and exit 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from disttrain.lab.bench.api import CONFIGS, SleepyDataset
from tests import zygote


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "disttrain", "bench", "api", *args]
    return zygote.run(cmd, capture_output=True, text=True, timeout=120)


def test_the_sleepy_dataset_is_map_style_and_sleeps() -> None:
    import time

    import torch

    data = SleepyDataset(torch.arange(4.0), torch.arange(4), delay=0.02)
    t0 = time.perf_counter()
    x, y = data[3]
    assert time.perf_counter() - t0 >= 0.02
    assert len(data) == 4 and float(x) == 3.0 and int(y) == 3


@pytest.mark.timeout(150)
def test_a_tiny_run_times_the_four_and_prints_ratios_that_parse(tmp_path: Path) -> None:
    path = tmp_path / "api.json"
    flags = ["--hidden", "16", "--batch-size", "4", "--steps", "2", "--rounds", "2"]
    done = _bench(*flags, "--warmup", "1", "--json", str(path))
    assert done.returncode == 0, done.stderr[-2000:]
    for pair in ("dt / ddp", "io / noio"):
        line = next(line for line in done.stdout.splitlines() if line.startswith(pair))
        ratio = re.search(r"([0-9.]+)x \[([0-9.]+), ([0-9.]+)\]", line)
        assert ratio and float(ratio.group(1)) > 0 and ("meets" in line or "misses" in line)
    record = json.loads(path.read_text())
    assert all(len(record["seconds"][kind]) == 2 for kind in CONFIGS)
    assert all(record["rows"][kind]["samples_per_second"] > 0 for kind in CONFIGS)
    assert record["rows"]["dt/ddp"]["target"] == 1.0 and record["rows"]["io/noio"]["target"] == 0.9
    assert record["load_per_batch_s"] > 0  # the measured step, slept by the io dataset
    # the same model on the same batches: the same parameters after the warm-up
    assert record["parameter_spread_after_warmup"]["dt/ddp"] < 1e-5
    assert record["parameter_spread"]["io/noio"] == 0.0


@pytest.mark.parametrize(
    "args",
    [
        ("--rounds", "0"),
        ("--batch-size", "3"),
        ("--hidden", "64,x"),
        ("--warmup", "0"),
        ("--load-ms", "-1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    done = _bench(*args)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
