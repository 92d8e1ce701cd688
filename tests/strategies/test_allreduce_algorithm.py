"""`disttrain train --algorithm NAME`: our ring reaches the same parameters as gloo's allreduce."""

from __future__ import annotations

import os
import sys

import torch

from tests import zygote


def _train(algorithm: str, out: str) -> dict[str, torch.Tensor]:
    cmd = [sys.executable, "-m", "disttrain", "train", "--workers", "2", "--max-steps", "6"]
    cmd += ["--batch-size", "32", "--algorithm", algorithm, "--out", out, "--no-progress"]
    done = zygote.run(cmd, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    state: dict[str, torch.Tensor] = torch.load(os.path.join(out, "model.pt"))
    return state


def test_ring_and_native_reach_the_same_parameters(tmp_path: object) -> None:
    native = _train("native", os.path.join(str(tmp_path), "native"))
    ring = _train("ring", os.path.join(str(tmp_path), "ring"))
    assert native.keys() == ring.keys()
    for key in native:
        # only the order of float additions differs (two ranks: none at all for
        # the sum itself, but gloo may add in another order); 6 momentum steps
        torch.testing.assert_close(ring[key], native[key], rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(v, torch.zeros_like(v)) for v in ring.values())


def test_unknown_algorithm_is_a_usage_error() -> None:
    cmd = [sys.executable, "-m", "disttrain", "train", "--algorithm", "nope"]
    done = zygote.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert (
        "--algorithm 'nope': unknown allreduce algorithm" in done.stderr
        and "Traceback" not in done.stderr
    )
