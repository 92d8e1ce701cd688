"""``--device cuda`` is refused at pre-flight unless a GPU run has proven the combination."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from disttrain import cli, config
from disttrain.comm.errors import UsageError
from disttrain.launch import gpu_support
from disttrain.launch.preflight import preflight
from tests.train.test_cuda import MIXED_RUNS, ONE_GPU_RUNS

#: every run tests/train/test_cuda.py makes on one GPU, with the combination it proves
NAMED_RUNS = ONE_GPU_RUNS + [((*f, "--precision", p), c) for f, p, _, c in MIXED_RUNS]


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    import disttrain.launch.local as local

    def trap(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a worker was launched")

    monkeypatch.setattr(local, "launch", trap)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _cuda(monkeypatch: pytest.MonkeyPatch, available: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)


def test_docs_list_exactly_the_proven_combinations() -> None:
    # docs/gpu.md, "Proven combinations": each row names its combination as the refusal does
    doc = (Path(__file__).parents[2] / "docs" / "gpu.md").read_text()
    table = doc.split("## Proven combinations", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    listed = rows[1:]  # below the header
    if not gpu_support.PROVEN:
        assert len(listed) == 1 and listed[0].startswith("| none yet"), listed
    else:
        assert len(listed) == len(gpu_support.PROVEN), listed
        for combo in gpu_support.PROVEN:
            assert any(f"`{combo}`" in row for row in listed), combo


def test_cuda_with_an_unproven_combination_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, no_launch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _cuda(monkeypatch, True)  # past the first check: the machine "has" CUDA
    code = cli.main(
        [
            "train",
            "--device",
            "cuda",
            "--algorithm",
            "ring",
            "--no-progress",
            "--out",
            str(no_launch / "o"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "has not been proven on a GPU" in lines[0] and "docs/gpu.md" in lines[0], lines[0]
    assert "--strategy allreduce --algorithm ring" in lines[0], lines[0]
    assert "(1 GPU)" in lines[0], lines[0]
    assert not (no_launch / "o").exists()


def test_no_cuda_is_still_the_first_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda(monkeypatch, False)
    cfg = config.load({"device": "cuda"})
    monkeypatch.setattr(gpu_support, "PROVEN", frozenset({gpu_support.combination(cfg)}))
    with pytest.raises(UsageError, match="no CUDA device is available"):
        preflight(cfg)


def test_a_proven_combination_passes_and_a_neighbour_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _cuda(monkeypatch, True)
    cfg = config.load({"device": "cuda", "max_steps": 1, "workers": 1})
    proven = gpu_support.combination(cfg)
    assert proven in gpu_support.PROVEN  # the one tests/train/test_cuda.py ran on a GPU
    monkeypatch.setattr(gpu_support, "PROVEN", frozenset({proven}))
    preflight(cfg)  # the table decides: this one is let through
    for change in (
        {"algorithm": "ring"},
        {"precision": "fp16"},
        {"check_collectives": True},
        {"workers": 2},
        {"compile": "inductor"},  # --compile is part of the combination (none proven yet)
    ):
        other = config.load({"device": "cuda", "max_steps": 1, "workers": 1, **change})
        with pytest.raises(UsageError, match="has not been proven"):
            preflight(other)
    topk = config.load({"device": "cuda", "workers": 1, "compression": "topk:0.1"})
    # the codec counts, not its ratio
    assert gpu_support.combination(topk) == dataclasses.replace(proven, compression="topk")
    assert gpu_support.unproven_reason(topk) is not None


@pytest.mark.parametrize("run", range(len(NAMED_RUNS)))
def test_each_one_gpu_run_proves_the_combination_it_names(
    run: int, monkeypatch: pytest.MonkeyPatch, no_launch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # tests/train/test_cuda.py's runs each name the combination they prove: the refusal
    # (nothing proven) must name that same combination for those flags
    flags, combo = NAMED_RUNS[run]
    _cuda(monkeypatch, True)
    monkeypatch.setattr(gpu_support, "PROVEN", frozenset())
    code = cli.main(
        [
            "train",
            "--device",
            "cuda",
            "--workers",
            "1",
            "--no-progress",
            "--out",
            str(no_launch / "o"),
            *flags,
        ]
    )
    assert code == 2
    assert f"--device cuda: {combo} has not been proven" in capsys.readouterr().err


def test_ranks_sharing_a_gpu_over_gloo_are_their_own_combination(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _cuda(monkeypatch, True)
    shared = config.load({"device": "cuda", "workers": 2, "backend": "gloo", "algorithm": "ring"})
    combo = gpu_support.combination(shared)
    assert (combo.several, combo.backend) == (True, "gloo")
    assert combo in gpu_support.PROVEN and gpu_support.unproven_reason(shared) is None
    # the same flags on NCCL (a GPU per rank) prove nothing of gloo's: refused, named so
    nccl = config.load({"device": "cuda", "workers": 2, "algorithm": "ring"})
    assert "(several GPUs)" in (gpu_support.unproven_reason(nccl) or "")
    assert not any(c.backend == "nccl" and c.several for c in gpu_support.PROVEN)


def test_the_proof_lets_candidates_through_but_never_several_nccl_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gpu_support, "PROVEN", frozenset())
    one = config.load({"device": "cuda", "workers": 1, "algorithm": "ring"})
    several = config.load({"device": "cuda", "workers": 2})
    assert gpu_support.unproven_reason(one) and gpu_support.unproven_reason(several)
    monkeypatch.setenv(gpu_support.PROVING_ENV, "1")  # make gpu-proof, on a GPU machine
    assert gpu_support.unproven_reason(one) is None
    assert "(several GPUs)" in (gpu_support.unproven_reason(several) or "")


def test_each_shared_gpu_run_proves_the_combination_it_names(
    monkeypatch: pytest.MonkeyPatch, no_launch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # tests/train/test_cuda.py's runs on one shared GPU: with nothing proven, each run's
    # refusal names the combination the test records for it
    from tests.train.test_cuda import GLOO_MIXED, GLOO_RUNS, _gloo_combo, _workers

    _cuda(monkeypatch, True)
    monkeypatch.setattr(gpu_support, "PROVEN", frozenset())
    runs = [(f, "fp32") for f in GLOO_RUNS] + [(f, p) for f, p, _ in GLOO_MIXED]
    for flags, precision in runs:
        workers, rest = _workers(flags)
        code = cli.main(
            [
                "train",
                "--device",
                "cuda",
                "--backend",
                "gloo",
                "--workers",
                str(workers),
                "--precision",
                precision,
                "--no-progress",
                "--out",
                str(no_launch / "o"),
                *rest,
            ]
        )
        err = capsys.readouterr().err
        assert code == 2, (flags, err)
        assert f"--device cuda: {_gloo_combo(flags, precision)} has not been proven" in err, err


@pytest.mark.timeout(180)
def test_gpu_proof_on_a_machine_without_cuda_skips_and_proves_nothing(tmp_path: Path) -> None:
    # docs/gpu.md's `make gpu-proof` (benchmarks/gpu_proof.sh), here without a GPU: every
    # CUDA test skips, the benchmark refuses in one line, and no row is printed
    import os
    import re
    import subprocess
    import sys

    repo = Path(__file__).parents[2]
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "OUT": str(tmp_path),
        "GPU_PROOF_XDIST": "0",
        "GPU_PROOF_WHEELS": str(tmp_path / "none"),
    }
    done = subprocess.run(
        ["bash", str(repo / "benchmarks" / "gpu_proof.sh")],
        env=env,
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=170,
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert re.search(r"^\d+ skipped in ", out, re.MULTILINE), out  # pytest's line: only skips
    assert "disttrain: error: bench one-gpu needs a CUDA device" in out, out
    assert "0 combinations proven by 0 passed tests" in out, out


def test_model_flops_per_token_follow_the_palm_count() -> None:
    from disttrain.data.datasets import pycode
    from disttrain.models import build_model
    from disttrain.models.gpt import flops_per_token

    # gpt2-small by hand: 12 blocks of 12 d^2 + 13 d (qkv, proj, fc, out and 2 LayerNorms)
    # plus the head (LayerNorm 2d, d x V + V); 6 per parameter, 12 L T d for attention
    d, vocab, seq = 768, 256, 128
    n = 12 * (12 * d * d + 13 * d) + 2 * d + d * vocab + vocab
    model = build_model("gpt2-small", pycode(40 * seq + 1, seq))
    assert flops_per_token(model, seq) == 6 * n + 12 * 12 * seq * d
