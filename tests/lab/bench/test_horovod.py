"""`disttrain bench horovod`: its ResNet-18 is torchvision's, a small run times the three
side by side on the same training, and bad input is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from disttrain.lab.bench.horovod import CONFIGS, resnet18
from tests import zygote


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "disttrain", "bench", "horovod", *args]
    return zygote.run(cmd, capture_output=True, text=True, timeout=120)


def test_the_model_is_resnet18_as_torchvision_lays_it_out() -> None:
    import torch

    model = resnet18()
    assert sum(p.numel() for p in model.parameters()) == 11_689_512  # torchvision's count
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 1000)


@pytest.mark.timeout(150)
def test_a_small_run_times_all_three_on_the_same_training(tmp_path: Path) -> None:
    path = tmp_path / "h.json"
    flags = ["--image-size", "32", "--batch-size", "2", "--rounds", "2"]
    done = _bench(*flags, "--batches-per-round", "1", "--warmup", "1", "--json", str(path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "horovod / ddp" in done.stdout and "horovod / disttrain" in done.stdout
    record = json.loads(path.read_text())
    assert all(len(record["seconds"][kind]) == 2 for kind in CONFIGS)
    assert all(record["rows"][kind]["img_per_second"] > 0 for kind in CONFIGS)
    assert record["rows"]["horovod/ddp"]["ratio"] > 0
    # the same model, batches and averaging: the same parameters at the end
    assert record["parameter_spread"] < 1e-6


@pytest.mark.parametrize(
    "args", [("--rounds", "0"), ("--image-size", "8"), ("--workers", "0"), ("--warmup", "-1")]
)
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    done = _bench(*args)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
