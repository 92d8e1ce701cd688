"""The `disttrain` command: bad input is one line and exit 2; runs write their outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from disttrain.cli import main
from tests import zygote

REPO = Path(__file__).resolve().parents[1]


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m disttrain ARGS`` in a subprocess, with a hard timeout."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    return zygote.run(
        [sys.executable, "-m", "disttrain", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


def _write_npz(path: Path, **arrays: np.ndarray) -> str:
    np.savez(path, **arrays)
    return str(path)


def _bad_inputs(tmp: Path) -> list[tuple[list[str], str]]:
    missing_arrays = _write_npz(tmp / "two.npz", x_train=np.zeros((4, 2)), y_train=np.zeros(4, int))
    toml_unknown = tmp / "unknown.toml"
    toml_unknown.write_text("workers = 2\nwrokers = 3\n")
    toml_bad = tmp / "bad.toml"
    toml_bad.write_text("workers = [\n")
    toml_type = tmp / "type.toml"
    toml_type.write_text('epochs = "ten"\n')
    return [
        (["train", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["train", "--workers", "0"], "--workers must be positive"),
        (["train", "--workers", "3", "--batch-size", "64"], "not divisible by the 3 workers"),
        (["train", "--epochs", "x"], "invalid int value"),
        (["train", "--dataset", str(tmp / "missing.npz")], "data file not found"),
        (["train", "--dataset", missing_arrays], "lacks the array(s) x_test, y_test"),
        (["train", "--model", "no_such_module:make"], "cannot import no_such_module"),
        (["train", "--model", "json:nothing"], "has no function 'nothing'"),
        (
            ["train", "--model", "transformer"],
            "--model 'transformer': unknown model; choose one of cnn, gpt, gpt2-small, mlp",
        ),
        (["train", "--dataset", "mnist"], "unknown dataset 'mnist'"),
        (["train", "--strategy", "magic"], "'magic': unknown strategy"),
        (["train", "--algorithm", "magic"], "--algorithm 'magic': unknown allreduce algorithm"),
        (["train", "--optimizer", "lbfgs"], "invalid choice: 'lbfgs'"),
        (["train", "--config", str(tmp / "nope.toml")], "config file not found"),
        (["train", "--config", str(toml_unknown)], "unknown key 'wrokers'"),
        (["train", "--config", str(toml_bad)], "is not valid TOML"),
        (["train", "--config", str(toml_type)], "setting 'epochs' must be int"),
        (["train", "--lr", "-1"], "--lr must be positive"),
        (["train", "--inject-fault", "kill:rank=5:step=1"], "names rank 5, but there are 2"),
        (["train", "--inject-fault", "explode:rank=0"], "kind must be one of"),
        (
            ["train", "--model", "cnn", "--dataset", "synthetic", "--synthetic-dim", "10"],
            "not a square",
        ),
        (["train", "--model", "gpt"], "--model gpt needs a language-model data set"),
        (["train", "--nnodes", "2"], "--nnodes > 1 needs --rdzv-endpoint"),
        (["train", "--batch-size", "4096"], "larger than the 1437 training samples"),
    ]


def test_bad_input_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, message in _bad_inputs(tmp_path):
        with pytest.raises(SystemExit) as exc_info:
            raise SystemExit(main(argv))
        err = capsys.readouterr().err
        assert exc_info.value.code == 2, (argv, err)
        assert message in err, (argv, err)
        assert len(err.strip().splitlines()) == 1, (argv, err)
        assert "Traceback" not in err


def test_bad_input_from_the_real_command_starts_no_worker(tmp_path: Path) -> None:
    result = run_cli(
        "train", "--workers", "3", "--batch-size", "64", "--out", str(tmp_path / "o"), timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "disttrain: error: --batch-size 64 is not divisible by the 3 workers: use a multiple of 3"
    ]
    assert not (tmp_path / "o").exists()


def test_a_short_run_writes_summary_metrics_and_model(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("epochs = 2\nbatch-size = 32\nworkers = 3\n")
    out = tmp_path / "run"
    result = run_cli("train", "--config", str(config), "--batch-size", "48", "--out", str(out))
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 3 and summary["global_batch_size"] == 48  # flag beats file
    assert summary["steps"] == 2 * (1437 // 48) and summary["epochs"] == 2
    assert summary["final_accuracy"] > 0.5
    # the default --algorithm auto ran shm here (one host): copied through shared memory
    assert summary["bytes_copied_per_rank"] > 0 and summary["bytes_sent_per_rank"] == 0
    assert set(summary["time_breakdown"]) >= {"compute", "communication"}
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == list(range(1, summary["steps"] + 1))
    assert (out / "model.pt").stat().st_size > 1_000_000
    assert "final_accuracy" in result.stdout  # the summary table


@pytest.mark.timeout(300)
def test_killing_one_of_three_workers_ends_the_job_naming_the_rank(tmp_path: Path) -> None:
    timeout = 10
    out = tmp_path / "k"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = zygote.popen(
        [
            sys.executable,
            "-m",
            "disttrain",
            "train",
            "--workers",
            "3",
            "--batch-size",
            "48",
            "--timeout",
            str(timeout),
            "--inject-fault",
            "kill:rank=1:step=5",
            "--no-progress",
            "--out",
            str(out),
        ],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # rank 0 logs step 4 just before rank 1 kills itself entering step 5
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 240  # start-up on a loaded 2-core machine
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.exists() and '"step": 4,' in metrics.read_text():
                break
            time.sleep(0.05)
        killed_at = time.monotonic()
        _, stderr = proc.communicate(timeout=timeout + 15)
        ended_after = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1
    assert ended_after <= timeout + 15
    assert "worker rank 1" in stderr and "SIGKILL" in stderr, stderr


def test_a_raising_worker_is_named_with_its_error(tmp_path: Path) -> None:
    result = run_cli(
        "train",
        "--workers",
        "2",
        "--timeout",
        "10",
        "--inject-fault",
        "raise:rank=1:step=3",
        "--out",
        str(tmp_path / "r"),
        timeout=240,
    )
    assert result.returncode == 1
    assert "worker rank 1" in result.stderr and "injected fault" in result.stderr, result.stderr
    # the last line is the root cause as rank 1 said it, not torch elastic's advice
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("disttrain: error: rank 1: RuntimeError: injected fault on rank 1"), last
    assert "traceback" not in last.lower(), last


# --- help that guides (issue 23) ---------------------------------------------------------


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exc_info:
        main([*argv, "--help"])
    assert exc_info.value.code == 0
    return capsys.readouterr().out


def test_train_help_has_one_group_per_settings_section_with_registry_choices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import dataclasses

    from disttrain.collectives import ALGORITHMS
    from disttrain.config import SECTIONS
    from disttrain.launch.job import _title
    from disttrain.models import MODELS
    from disttrain.parallel.pipeline import SCHEDULES
    from disttrain.strategies import STRATEGIES

    text = _help(capsys, "train")
    titles = {line[:-1] for line in text.splitlines() if line and not line.startswith(" ")}
    for cls in SECTIONS:  # every section is a group (new sections join by themselves)
        grouped = {n for names in getattr(cls, "GROUPS", {}).values() for n in names}
        if {f.name for f in dataclasses.fields(cls)} - grouped:
            assert _title(cls) in titles, (cls, titles)
        for title in getattr(cls, "GROUPS", {}):
            assert title in titles, (title, titles)
    for registry, flag in (
        (STRATEGIES, "--strategy"),
        (ALGORITHMS, "--algorithm"),
        (MODELS, "--model"),
        (SCHEDULES, "--schedule"),
    ):
        block = " ".join(text.split(f"  {flag} ")[1].split("\n  --")[0].split())
        assert f"choices: {', '.join(registry.names())}" in block, (flag, block)
    for line in text.split("\n  --"):
        assert " ".join(line.split()).count("(default:") <= 1, line
    assert "(default: a new folder under runs/)" in text  # said in words once, not twice


def test_compare_help_shows_its_own_options_first_and_advise_has_a_description(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = _help(capsys, "compare")
    assert text.index("--strategies") < text.index("--workers") < text.index("--epochs")
    assert len(text.split("options:")[0].splitlines()) < 6  # a short usage line
    assert "Rank the strategies" in _help(capsys, "advise")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["train", "--epoch", "1"], "unrecognized arguments: --epoch 1; did you mean --epochs?"),
        (["train", "--wrokers", "3"], "; did you mean --workers?"),
        (["compare", "--strategies", "allreduce", "--targett", "1"], "did you mean --target?"),
        (["advise", "--param", "25M"], "did you mean --params?"),
        (["bench", "allreduce", "--worker", "2"], "did you mean --workers?"),
    ],
)
def test_no_prefix_abbreviations_and_a_hint_for_misspelt_flags(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc_info:
        raise SystemExit(main(argv))
    err = capsys.readouterr().err
    assert exc_info.value.code == 2 and said in err, err
    assert err.startswith("disttrain: error: ") and len(err.strip().splitlines()) == 1, err
