"""Every script in examples/ runs in some test, as its docstring says to run it.

Most are run elsewhere (a docs block's check, or the test of the feature they show);
:data:`HERE` lists the ones this file runs. The list of examples comes from the folder, so
a new example without a test fails :func:`test_every_example_is_run_by_a_test`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.test_commands import STEPS, _at_once, _summary

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*.py"))
#: the examples this file runs; each other one is named by another test or a docs block
#: that tests/docs/test_commands.py runs
HERE = ("ddp_comm_hook.py", "parameter_server.py", "pipeline_gpipe.py", "tensor_parallel.py")


def test_every_example_is_run_by_a_test() -> None:
    here = Path(__file__).resolve()
    runners = [p.read_text() for p in (REPO / "tests").rglob("*.py") if p.resolve() != here]
    docs = "".join(p.read_text() for p in [REPO / "README.md", *(REPO / "docs").glob("*.md")])
    unrun = []
    for example in EXAMPLES:
        # a docs block's line, or its --model examples.X:fn, which that block's check runs
        shown = (f"python examples/{example.name}", f"examples.{example.stem}:")
        named = any(f"examples/{example.name}" in t or f'"{example.name}"' in t for t in runners)
        if example.name not in HERE and not named and not any(s in docs for s in shown):
            unrun.append(example.name)
    assert not unrun, f"examples no test runs: {unrun}"


@pytest.mark.timeout(300)
def test_the_command_line_examples_train_under_the_budget(tmp_path: Path) -> None:
    """Each is ``disttrain train`` with its own flags first; flags after them take over
    (argparse's last wins): the docs' step budget and an output folder."""
    names = [
        n for n in HERE if "from disttrain.cli import main" in (REPO / "examples" / n).read_text()
    ]
    assert names == ["parameter_server.py", "pipeline_gpipe.py", "tensor_parallel.py"]
    outs = [tmp_path / n.removesuffix(".py") for n in names]
    commands = [
        [
            sys.executable,
            str(REPO / "examples" / n),
            "--max-steps",
            str(STEPS),
            "--no-progress",
            "--out",
            str(out),
        ]
        for n, out in zip(names, outs, strict=True)
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = _at_once(commands, REPO, env, 240)
    for name, out in zip(names, outs, strict=True):
        summary = _summary(out)
        assert summary["steps"] == STEPS and summary["world_size"] >= 2, (name, summary)
    strategies = [_summary(out)["config"]["strategy"] for out in outs]
    assert strategies == ["ps", "pipeline", "tensor"]
    assert "F" in done[1].stdout  # pipeline_gpipe prints its schedule first: stage by tick


@pytest.mark.timeout(180)
def test_the_ddp_comm_hook_example_trains_under_torchrun() -> None:
    """As its docstring runs it, on a free port (--standalone) and with 3 steps."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "src"),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        str(Path(sys.executable).with_name("torchrun")),
        "--standalone",
        "--nproc-per-node",
        "2",
        "examples/ddp_comm_hook.py",
        "--algorithm",
        "ring",
        "--steps",
        "3",
    ]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    match = re.search(r"^ring: 3 steps, last loss (\S+)$", done.stdout, re.M)
    assert match and 0 < float(match.group(1)) < 3, done.stdout
