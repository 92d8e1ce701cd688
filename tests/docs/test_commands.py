"""Every fenced code block in README.md and docs/*.md does what the text around it says.

What is checked, and how:

- **Coverage.** :func:`_blocks` finds every fenced block (```` ``` ```` or ``~~~``, also
  indented inside a list item). :data:`ENTRIES` (at the end of this file) holds one entry
  per block, keyed by its file and a stable part of its first line, not by position, so
  reordering the docs breaks nothing. A block with no entry fails
  :func:`test_every_block_has_exactly_one_entry` naming ``file:line`` ("add an entry"),
  so a command cannot land in the docs uncovered; an entry that matches no block fails
  it too (stale).
- **Commands that run here run**, as written, through the command line
  (``tests/test_cli.py``'s :func:`run_cli`; ``advise`` and ``--help`` in-process through
  :func:`disttrain.cli.main`, their work being pure computation). The one budget knob,
  the same for every ``disttrain train`` and ``compare`` command (:func:`_budgeted`): at
  most :data:`STEPS` steps (``--max-steps`` appended, or lowered where the text gives
  more), ``--no-progress``, and output paths (``--out``, ``--timeline``, ``--json``,
  ``--tensorboard``) moved into ``tmp_path`` (an ``--out`` is added where none is given,
  so nothing lands in the repository's ``runs/``). Two steps are the smallest run that
  still proves the claims here: a step after the first holds every optimizer state (the
  memory-limit example), and no block's claim is an accuracy cheap enough to train for.
- **The outcome the text states**: exit 0 and a ``summary.json`` that parses with finite
  losses (plus the settings the command names); files written exist and parse (trace,
  report, ``runs.json``, ``--json`` rows, key file); "exit 1" with the quoted error line.
- **Commands that cannot run on one machine** (``sudo`` cluster verbs, Slurm, Kubernetes,
  ``--nnodes 2``, ``--launcher ray``, ``--calibrate``'s minutes of benches): the CLI's own
  parser and, for ``train``, its config loader accept them without running
  (:func:`_accepts`); torchrun's parser for torchrun's flags; the files they name exist
  and parse.
- **Python blocks** are exec'd as written: in a 2-rank world (``tests.harness.run_world``)
  when they need a process group, in a namespace that supplies only the names the text
  leaves to the reader (``model``, ``opt``, ``tensor``, ...: :func:`_namespace`).
- **Not commands** (diagrams, before/after import lines) are entries without a check,
  with the reason.
- **Not found**: indented code blocks (four spaces, no fence). The docs have none: every
  code block is fenced, so that this test finds it.
- **Cost**: about 60 commands, 32 of them real runs (each a fresh interpreter, most with 2
  to 4 workers; a "How to run" list's runs at once): the longest cases (``compare``'s four
  runs, the memory-limit example, the two run lists) are collected first, so that ``-n 3``
  does not end on one.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import zygote
from tests.harness import run_world
from tests.ports import free_port
from tests.test_cli import run_cli

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
STEPS = 2  # the budget of every documented run (module docstring)
OUTPUT_FLAGS = ("--out", "--timeline", "--json", "--tensorboard")
#: a calibration to use as is (docs/lab.md, "Validation"): stands for the user's saved one
CALIBRATION = REPO / "benchmarks" / "results" / "costmodel_calibration_v6_run1.json"
HOROVOD = REPO / "tests" / "horovod"
VENV_BIN = Path(sys.executable).parent  # where `disttrain`, `python`, `torchrun` are
Check = Callable[[str, Path], None]


# --- the blocks -------------------------------------------------------------------------

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<lang>[^`]*)$")


@dataclass(frozen=True)
class Block:
    file: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    lang: str
    text: str  # the lines between the fences, the fence's indent removed

    @property
    def first(self) -> str:
        return next((line.strip() for line in self.text.splitlines() if line.strip()), "")


def _dedent(line: str, indent: int) -> str:
    return line[min(indent, len(line) - len(line.lstrip(" "))) :]


def _blocks_of(path: Path) -> Iterator[Block]:
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        # the closing fence: the same character, at least as many, nothing else
        end = next(
            (
                j
                for j in range(i + 1, len(lines))
                if lines[j].strip().startswith(fence) and set(lines[j].strip()) == {fence[0]}
            ),
            len(lines),
        )
        # a block inside a list item: its lines lose the fence's indent (at most)
        body = [_dedent(line, indent) for line in lines[i + 1 : end]]
        yield Block(path.relative_to(REPO).as_posix(), i + 1, m["lang"].strip(), "\n".join(body))
        i = end + 1


def _blocks() -> list[Block]:
    return [block for path in DOCS for block in _blocks_of(path)]


@dataclass(frozen=True)
class Entry:
    file: str
    key: str  # a stable part of the block's first line
    how: str  # how the block is checked, or why it is not a command
    check: Check | None = None  # None: not a command
    timeout: float = 120.0  # the test's @pytest.mark.timeout, seconds

    def matches(self, block: Block) -> bool:
        return block.file == self.file and self.key in block.first


# --- running what the blocks say ----------------------------------------------------------


def _commands(text: str) -> list[list[str]]:
    """The block's shell commands as argv lists: continuation lines joined, comments and
    blank lines dropped."""
    joined = re.sub(r"\\\n", " ", text)
    return [argv for line in joined.splitlines() if (argv := shlex.split(line, comments=True))]


def _disttrain_args(argv: list[str]) -> list[str]:
    """What follows the ``disttrain`` word (``disttrain``, ``.venv/bin/disttrain``, after
    ``sudo``): the arguments of ``python -m disttrain``."""
    i = next(i for i, word in enumerate(argv) if Path(word).name == "disttrain")
    return argv[i + 1 :]


def _budgeted(argv: list[str], tmp: Path) -> list[str]:
    """The one budget knob (module docstring), for ``train`` and ``compare``; output paths
    of any command go into ``tmp``."""
    args = [
        str(tmp / Path(a).name) if i and argv[i - 1] in OUTPUT_FLAGS else a
        for i, a in enumerate(argv)
    ]
    if args[0] in ("train", "compare"):
        if "--max-steps" in args:
            i = args.index("--max-steps") + 1
            args[i] = str(min(int(args[i]), STEPS))
        else:
            args += ["--max-steps", str(STEPS)]
        if "--no-progress" not in args:
            args.append("--no-progress")
        if "--out" not in args:  # a fresh folder each: two runs into one would be refused
            args += ["--out", str(tmp / f"run-{len(list(tmp.glob('run-*')))}")]
    return args


def _failed(argv: list[str], done: subprocess.CompletedProcess[str]) -> str:
    tail = f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return f"{shlex.join(argv)}: exit {done.returncode}\n{tail}"


def _sh(
    argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """A command that is not ``python -m disttrain`` from the repository (run_cli's case)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})}
    return zygote.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _summary(out: Path) -> dict[str, Any]:
    """``out/summary.json``, which must parse and hold finite losses."""
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    for key in ("final_train_loss", "final_test_loss"):
        assert math.isfinite(summary[key]), (out, key, summary[key])
    return summary


def _train(argv: list[str], tmp: Path, timeout: float = 180) -> dict[str, Any]:
    """Run a documented ``disttrain`` command under the budget: exit 0, and its summary."""
    args = _budgeted(argv, tmp)
    done = run_cli(*args, timeout=timeout)
    assert done.returncode == 0, _failed(args, done)
    return _summary(Path(args[args.index("--out") + 1]))


def _in_process(argv: list[str]) -> tuple[int, str, str]:
    """``disttrain ARGV`` in this process: (exit code, stdout, stderr)."""
    from disttrain.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's --help and usage errors
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def _accepts(argv: list[str]) -> argparse.Namespace:
    """The CLI's parser (and for ``train`` its config loader) accepts ``disttrain ARGV``,
    without running it."""
    from disttrain.cli import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = build_parser(argv[0]).parse_args(argv)
    except SystemExit:
        pytest.fail(f"disttrain {shlex.join(argv)} is refused: {err.getvalue().strip()}")
    if ns.command == "train":
        _train_config(argv)  # a bad value raises, naming it
    return ns


def _train_config(argv: list[str]) -> Any:
    """``disttrain train ...``'s settings, as the command would load them (not run)."""
    from disttrain import config
    from disttrain.cli import build_parser

    ns = build_parser("train").parse_args(argv)
    flags = {k: v for k, v in vars(ns).items() if k not in ("command", "config")}
    return config.load(flags, getattr(ns, "config", None))


def _torchrun_accepts(argv: list[str]) -> argparse.Namespace:
    """torchrun's own parser accepts ``argv`` (``torchrun ...``); with ``-m disttrain``, the
    arguments after it are accepted by :func:`_accepts`."""
    from torch.distributed.run import get_args_parser

    assert Path(argv[0]).name == "torchrun", argv
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = get_args_parser().parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"{shlex.join(argv)} is refused by torchrun: {err.getvalue().strip()}")
    if args.module:
        assert args.training_script == "disttrain", argv
        _accepts(args.training_script_args)
    return args


# --- Python blocks in a world -------------------------------------------------------------


def _namespace(code: str, rank: int) -> dict[str, Any]:
    """The names a block uses but leaves to the reader, and only those: a tiny model, its
    optimizer, tensors, sizes. Ranks start from different weights, so a broadcast in the
    block shows."""
    import torch
    from torch import nn

    torch.manual_seed(rank)
    model = nn.Linear(4, 2)
    provided: dict[str, Callable[[], Any]] = {
        "torch": lambda: torch,  # the blocks call torch.optim.Adam without importing torch
        "model": lambda: model,
        "opt": lambda: torch.optim.SGD(model.parameters(), lr=0.1),
        "loss": lambda: torch.tensor(float(rank)),
        "t": lambda: torch.full((3,), float(rank)),
        "epoch": lambda: 0,
        "tensor": lambda: torch.full((8,), rank + 1.0),  # the sum over 2 ranks: 3
        "nbytes": lambda: 4096,
        "world_size": lambda: 2,
        "rank": lambda: rank,
        "itemsize": lambda: 4,
        "batches": lambda: [(torch.randn(4, 4), torch.randint(0, 2, (4,))) for _ in range(2)],
        "loss_fn": lambda: nn.CrossEntropyLoss(),
        "ddp": lambda: nn.parallel.DistributedDataParallel(nn.Linear(4, 2)),
    }
    return {name: make() for name, make in provided.items() if re.search(rf"\b{name}\b", code)}


def _prepare_rank() -> None:
    """What this world differs in from a user's process, and only that."""
    import torch.distributed as dist

    import disttrain.launch.entry as entry

    real_train = entry.train

    def budgeted(config: Any = None, trackers: Any = (), **settings: Any) -> dict[str, Any]:
        # the budget knob of the commands, for disttrain.train(config) in a block
        return real_train(config, trackers, **{**settings, "max_steps": STEPS, "progress": False})

    def formed(backend: str | None = None, *args: Any, **kwargs: Any) -> None:
        # the harness formed the group before the block runs ("or Ray, Slurm, torchrun
        # already did", docs/launching.md): a second init would raise
        assert dist.is_initialized() and backend in (None, dist.get_backend())

    entry.train = budgeted
    dist.init_process_group = formed


After = Callable[[str, dict[str, Any]], Any]


def _exec_in_rank(code: str, folder: str, after: After) -> Any:
    """On every rank: exec the block from ``folder`` (its relative paths land there), then
    ``after(code, namespace)``, whose picklable result comes back."""
    import torch.distributed as dist

    os.chdir(folder)
    _prepare_rank()
    ns = _namespace(code, dist.get_rank())
    exec(compile(code, "<doc block>", "exec"), ns)
    return after(code, ns)


def _in_world(code: str, tmp: Path, after: After) -> list[Any]:
    folder = tmp / "world"
    folder.mkdir(exist_ok=True)
    return run_world(_exec_in_rank, 2, args=(code, str(folder), after), timeout=150)


def _check_summaries(summaries: list[dict[str, Any]]) -> None:
    """Every rank returns rank 0's summary, of a 2-rank job under the budget."""
    assert summaries[0] == summaries[1]
    assert summaries[0]["world_size"] == 2 and summaries[0]["steps"] == STEPS
    assert all(math.isfinite(summaries[0][k]) for k in ("final_train_loss", "final_test_loss"))


def _after_default_out(code: str, ns: dict[str, Any]) -> Any:
    """The summary of the block's one run, in rank 0's default folder (runs/...)."""
    (path,) = Path("runs").glob("*/summary.json")
    return json.loads(path.read_text())


def _after_api(code: str, ns: dict[str, Any]) -> Any:
    full = ns["model"].full_state_dict()  # collective: the block's last line drops its result
    return {"summary": ns["summary"], "keys": sorted(full or {}), "state": os.path.isdir("state")}


def _after_plain_loop(code: str, ns: dict[str, Any]) -> Any:
    from torch.nn import functional as F

    return float(F.mse_loss(ns["model"](ns["x"]), ns["y"]) / ns["y"].var())


def _check_plain_loop(text: str, tmp: Path) -> None:
    for share in _in_world(text, tmp, _after_plain_loop):
        assert share < 0.2, f"the plain loop's MSE is {share:.3f} of the targets' variance"


def _strategy_variants(code: str) -> dict[str, str]:
    """The block once per registered strategy: its ``strategy="allreduce"`` replaced by each
    strategy's first mode (its own declaration, ``StrategySettings.modes``)."""
    from tests.modes import first_modes, keywords

    variants = {}
    for name, words in first_modes().items():
        extra = "".join(f", {k}={json.dumps(v)}" for k, v in keywords(words).items())
        variants[name] = code.replace('strategy="allreduce"', f'strategy="{name}"{extra}')
    return variants


def _every_strategy_in_rank(codes: dict[str, str], folder: str) -> dict[str, Any]:
    """On every rank: each variant of the block in turn; rank 0's training MSE of the model
    ``run.finish()`` returns, as a share of the targets' variance (a serving process's
    ``run.loader`` serves and yields nothing)."""
    import torch
    from torch.nn import functional as F

    os.chdir(folder)
    results = {}
    for name, code in codes.items():
        ns: dict[str, Any] = {}
        exec(compile(code, f"<doc block: {name}>", "exec"), ns)
        whole = ns["run"].finish()
        if whole is not None:
            with torch.no_grad():
                mse = F.mse_loss(whole(ns["x"]), ns["y"])
            results[name] = float(mse / ns["y"].var())
    return results


def _check_every_strategy_block(text: str, tmp: Path) -> None:
    """The four-line diff, run on 2 ranks for every registered strategy: rank 0 gets the
    whole model, and it learned: its MSE under half the targets' variance after the
    block's 3 epochs (24 steps; DiLoCo, which averages least often, ends at 0.43)."""
    folder = tmp / "world"
    folder.mkdir(exist_ok=True)
    variants = _strategy_variants(text)
    results = run_world(_every_strategy_in_rank, 2, args=(variants, str(folder)), timeout=300)
    assert set(results[0]) == set(variants)
    for name, share in results[0].items():
        assert share < 0.5, f"{name}: training MSE {share:.3f} of the targets' variance"


def _value_of(code: str, start: str, ns: dict[str, Any]) -> Any:
    """The value of the block's line that starts with ``start``: one the block drops, whose
    comment says what it is."""
    line = next(line for line in code.splitlines() if line.startswith(start))
    return eval(line.split("  #")[0], ns)


def _after_collectives(code: str, ns: dict[str, Any]) -> Any:
    cost = _value_of(code, 'collectives.get("ring").cost(', ns)
    path = _value_of(code, 'critical_path("ring",', ns)
    assert "ring" in _value_of(code, "collectives.ALGORITHMS", ns)  # "the registry: `in`"
    return {"tensor": ns["tensor"], "cost": cost, "steps": path.steps}


def _after_model(code: str, ns: dict[str, Any]) -> Any:
    import torch

    assert isinstance(ns["opt"], torch.optim.Optimizer)  # "is a torch.optim.Optimizer"
    return dict(ns["model"].state_dict())


def _after_ddp_hook(code: str, ns: dict[str, Any]) -> Any:
    """One step through the hooked DDP: each rank's own input, the averaged gradient."""
    import torch
    import torch.distributed as dist

    ddp = ns["ddp"]
    ddp(torch.full((2, 4), float(dist.get_rank() + 1))).sum().backward()
    return [p.grad for p in ddp.parameters()]


def _after_sharded(code: str, ns: dict[str, Any]) -> Any:
    import torch
    from torch import nn

    if ns["state"]:  # "the plain model's state_dict", "torch.optim.Adam(plain)'s"
        plain = nn.Linear(4, 2)
        plain.load_state_dict(ns["state"])
        torch.optim.Adam(plain.parameters()).load_state_dict(ns["optim"])
    return {"state": sorted(ns["state"] or {}), "optim": sorted(ns["optim"] or {})}


def _after_entry(code: str, ns: dict[str, Any]) -> Any:
    return {"summary": ns["summary"], "written": os.path.exists("runs/x/summary.json")}


# --- the checks, one per kind of block ----------------------------------------------------

#: what each make target's recipe must contain (the block's comments say what it runs)
MAKE_RUNS = {
    "train": ["disttrain train"],
    "test": ["ruff check", "mypy", "pytest"],
    "gpu-proof": ["bash benchmarks/gpu_proof.sh"],
}


def _check_shape(text: str, tmp: Path) -> None:
    """``make shape`` runs (it reads the source only) and prints each figure the text names."""
    (argv,) = _commands(text)
    done = _sh(argv, REPO, timeout=120)
    assert done.returncode == 0, _failed(argv, done)
    for words in (
        "Strategy:",
        "AllReduceAlgorithm:",
        "Compressor:",
        "functions over 60 lines",
        "train/trainer.py:",
        "'# fmt: skip'",
        "benchmarks/RESULTS.md:",
    ):
        assert words in done.stdout, (words, done.stdout)


def _check_make(text: str, tmp: Path) -> None:
    """``make T``: not run (``make test`` is the suite itself, ``gpu-proof`` needs a GPU);
    the Makefile has T, ``make -n T`` works and shows what the text says T runs, and a
    script it runs with bash parses."""
    makefile = (REPO / "Makefile").read_text()
    for argv in _commands(text):
        assert argv[0] == "make" and len(argv) == 2, argv
        target = argv[1]
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"Makefile lacks {target}"
        done = _sh(["make", "-n", target], REPO, timeout=60)
        assert done.returncode == 0, _failed(["make", "-n", target], done)
        for words in MAKE_RUNS[target]:
            assert words in done.stdout, (target, done.stdout)
        if target == "train":  # "(2 workers, MLP on digits)": its defaults
            defaults = _train_config(["train"]).to_dict()
            assert (defaults["workers"], defaults["model"], defaults["dataset"]) == (
                2,
                "mlp",
                "digits",
            )
        for line in done.stdout.splitlines():
            if line.startswith("bash "):
                parsed = _sh(["bash", "-n", *shlex.split(line)[1:]], REPO, timeout=30)
                assert parsed.returncode == 0, _failed(["bash", "-n", line], parsed)


def _check_readme_train(text: str, tmp: Path) -> None:
    cnn, from_file, helped = (_disttrain_args(argv) for argv in _commands(text))
    s = _train(cnn, tmp)
    assert (s["world_size"], s["config"]["model"], s["global_batch_size"]) == (4, "cnn", 128)
    # "flags override the file": the file says another lr than the flag
    toml = (REPO / from_file[from_file.index("--config") + 1]).read_text()
    file_lr = re.search(r"^lr = (\S+)$", toml, re.M)
    assert file_lr and float(file_lr[1]) != 0.1, file_lr
    assert _train(from_file, tmp)["config"]["lr"] == float(from_file[-1]) == 0.1
    code, out, err = _in_process(helped)  # "every flag, grouped by component, with choices"
    assert code == 0, err
    assert {"run:", "model:"} <= set(out.splitlines()) and "choices:" in out


def _check_user_workloads(text: str, tmp: Path) -> None:
    """Both commands train the user's workloads (budgeted): float targets and a language
    model report no accuracy, and a finite held-out loss."""
    for argv in _commands(text):
        args = _disttrain_args(argv)
        s = _train(args, tmp)
        assert s["config"]["dataset"] == args[args.index("--dataset") + 1]
        assert s["final_accuracy"] is None and math.isfinite(s["final_test_loss"])


def _check_own_model(text: str, tmp: Path) -> None:
    """The block trains mymodels.py (the block above it) on an .npz, from the folder
    holding mymodels.py, with the console script: the claim is that disttrain imports from
    there as ``python -m`` would (``python -m disttrain`` would put the folder on sys.path
    by itself, proving nothing)."""
    (factory,) = [b for b in BLOCKS if b.file == "README.md" and "# mymodels.py" in b.first]
    (tmp / "mymodels.py").write_text(factory.text)
    line = re.search(r"^(\S*disttrain train --model mymodels:make .*)$", text, re.M)
    assert line, "README.md: the command that trains mymodels:make is gone"
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(96, 8)).astype(np.float32), rng.integers(0, 3, 96).astype(np.int64)
    np.savez(tmp / "mydata.npz", x_train=x[:64], y_train=y[:64], x_test=x[64:], y_test=y[64:])
    args = _budgeted(_disttrain_args(shlex.split(line[1])), tmp)
    # the installed package only: neither src/ nor tmp is put on sys.path for it
    done = _sh([str(VENV_BIN / "disttrain"), *args], tmp, env={"PYTHONPATH": ""})
    assert done.returncode == 0, _failed(args, done)
    s = _summary(Path(args[args.index("--out") + 1]))
    assert s["config"]["model"] == "mymodels:make" and s["world_size"] == 2


def _runs(argv: list[str]) -> bool:
    """A line :func:`_run_all` runs: ``disttrain train``, or ``python examples/X.py`` (each a
    ``disttrain train`` with its own flags first, taking more: the budget's)."""
    example = argv[0] == "python" and argv[1].startswith("examples/")
    return argv[:2] == ["disttrain", "train"] or example


def _run_all(text: str, tmp: Path) -> None:
    """Every ``disttrain train`` and ``python examples/X.py`` line of the block runs under
    the budget, all at once (most of a run is start-up and waiting, on 2 cores); every
    other line is checked by :func:`_parse_rest`."""
    lines = [a for a in _commands(text) if _runs(a)]
    commands, outs = [], []
    for i, argv in enumerate(lines):
        (tmp / f"line-{i}").mkdir()
        args = _budgeted(
            ["train", *argv[2:]] if argv[0] == "python" else _disttrain_args(argv),
            tmp / f"line-{i}",
        )
        head = [str(REPO / argv[1])] if argv[0] == "python" else ["-m", "disttrain", "train"]
        commands.append([sys.executable, *head, *args[1:]])
        outs.append(Path(args[args.index("--out") + 1]))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    for out, done in zip(outs, _at_once(commands, REPO, env, 240), strict=True):
        assert _summary(out)["steps"] == STEPS, done.args
    _parse_rest(text)


def _at_once(
    commands: list[list[str]], cwd: Path, env: dict[str, str], timeout: float
) -> list[subprocess.CompletedProcess[str]]:
    """Run ``commands`` all at once (most of each is start-up and waiting, on 2 cores);
    each must exit 0. Their results, in order; none is left running."""
    procs = [
        zygote.popen(
            argv, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for argv in commands
    ]
    results = []
    try:
        for argv, proc in zip(commands, procs, strict=True):
            stdout, stderr = proc.communicate(timeout=timeout)
            done = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
            assert done.returncode == 0, _failed(argv, done)
            results.append(done)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


def _parse_rest(text: str) -> None:
    """The block's lines that :func:`_run_all` does not run: benchmarks (minutes each; the
    tests under tests/lab/bench run their code at small sizes) and root's commands are
    accepted by the parser."""
    for argv in _commands(text):
        if not _runs(argv):
            _accepts(_disttrain_args(argv))


def _check_parsed(text: str, tmp: Path) -> None:
    """Accepted by the parser: what runs in another test, which the entry names. Output
    lines (``disttrain: ...``) are skipped, and a shell's trailing ``&``."""
    for argv in _commands(text):
        if argv[0].endswith(":"):
            continue
        argv = argv[:-1] if argv[-1] == "&" else argv
        if argv[0] == "torchrun" or "torchrun" in argv[:2]:
            _torchrun_accepts(argv[argv.index("torchrun") :])
            continue
        choices = [w for w in argv if "|" in w]  # a synopsis: `--model mlp|cnn|gpt`
        for pick in choices[0].split("|") if choices else [""]:
            _accepts(_disttrain_args([pick if "|" in w else w for w in argv]))


def _check_multinode(text: str, tmp: Path) -> None:
    """Two nodes cannot run here: the same command is accepted by disttrain's parser and
    config, and torchrun's line by torchrun's parser (then disttrain's)."""
    for argv in _commands(text):
        if argv[0] == "torchrun":
            args = _torchrun_accepts(argv)
            assert (args.nnodes, args.rdzv_backend) == ("2", "c10d")
        else:
            ns = _accepts(_disttrain_args(argv))
            assert (ns.nnodes, ns.rdzv_endpoint) == (2, "10.0.0.1:29400")


def _check_sbatch(argv: list[str], tmp: Path) -> None:
    """No Slurm controller here: the script exists and parses, and what it runs with the
    block's arguments (its $PYTHON replaced by a stub that prints its argv) is a
    ``disttrain train --launcher slurm`` command the CLI accepts."""
    script = next(a for a in argv if a.endswith(".sbatch"))
    assert "#SBATCH --nodes=" in (REPO / script).read_text()
    assert _sh(["bash", "-n", script], REPO, timeout=30).returncode == 0
    stub = tmp / "python-stub"
    stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    stub.chmod(0o755)
    rest = argv[argv.index(script) + 1 :]
    done = _sh(["bash", script, *rest], REPO, env={"PYTHON": str(stub)}, timeout=30)
    assert done.returncode == 0, _failed(argv, done)
    ran = done.stdout.splitlines()
    assert ran[:2] == ["-m", "disttrain"], ran
    assert _accepts(ran[2:]).launcher == "slurm" and ran[-len(rest) :] == rest


def _containers(path: Path) -> list[list[str]]:
    """Each container's command + args in a Kubernetes manifest (yaml if installed; else
    the manifest's flow lists, which are JSON)."""
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        text = path.read_text()
        cmds = re.findall(r"^\s*command: (\[.*\])$", text, re.M)
        args = re.findall(r"^\s*args: (\[.*\])$", text, re.M)
        return [json.loads(c) + json.loads(a) for c, a in zip(cmds, args, strict=True)]
    job = yaml.safe_load(path.read_text())
    assert job["kind"] == "PyTorchJob", job.get("kind")
    return [
        [*c["command"], *c.get("args", [])]
        for spec in job["spec"]["pytorchReplicaSpecs"].values()
        for c in spec["template"]["spec"]["containers"]
    ]


def _check_kubectl(argv: list[str], tmp: Path) -> None:
    """No cluster here: the manifest parses and every pod's command is accepted by
    torchrun's parser and disttrain's (tests/test_kubernetes_example.py checks the schema)."""
    commands = _containers(REPO / argv[argv.index("-f") + 1])
    assert commands
    for command in commands:
        assert _torchrun_accepts(command).module


def _check_engines(text: str, tmp: Path) -> None:
    local, ray, sbatch, kubectl, python = _commands(text)
    assert _train(_disttrain_args(local), tmp)["world_size"] == 4
    # Ray's cluster is not started here; the optional [--ray-address ...] both ways
    plain = [a.strip("[]") for a in _disttrain_args(ray)]
    for args in (plain[: plain.index("--ray-address")], plain):
        assert _accepts(args).launcher == "ray"
    _check_sbatch(sbatch, tmp)
    _check_kubectl(kubectl, tmp)
    assert python[:2] == ["python", "-c"], python
    _check_summaries(_in_world(python[2], tmp, _after_default_out))  # "in a group you formed"


def _check_readme_api(text: str, tmp: Path) -> None:
    results = _in_world(text, tmp, _after_api)
    _check_summaries([r["summary"] for r in results])
    assert results[0]["keys"] == ["bias", "weight"]  # the whole state on rank 0
    assert results[0]["state"]  # the elastic state's commit went to root="state"


def _check_cluster(text: str, tmp: Path) -> None:
    """Root's network namespaces: parsed, not run; ``run -- CMD``'s command too."""
    for argv in _commands(text):
        assert argv[0] == "sudo", argv
        ns = _accepts(_disttrain_args(argv))
        verb = getattr(ns, "verb", None)  # compare has none
        if verb == "run":
            _accepts(_disttrain_args(ns.cmd))
        if verb == "measure":  # "h0 -> h1" by default
            assert (ns.src, ns.dst) == (0, 1)


def _check_collectives(text: str, tmp: Path) -> None:
    for got in _in_world(text, tmp, _after_collectives):
        assert got["tensor"].tolist() == [3.0] * 8  # in place, the sum of 1 and 2
        # the table's ring row at n = 2, S = 4096: 2(n-1)/n·S bytes, 2(n-1) messages, steps
        assert (got["cost"].bytes_sent, got["cost"].messages, got["steps"]) == (4096, 2, 2)


def _check_horovod_api(text: str, tmp: Path) -> None:
    import torch

    first, second = _in_world(text, tmp, _after_model)
    for name in first:  # the ranks started apart: broadcast_parameters made them equal
        assert torch.equal(first[name], second[name]), name


def _check_ddp_hook(text: str, tmp: Path) -> None:
    import torch

    first, second = _in_world(text, tmp, _after_ddp_hook)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)  # the hooked allreduce averaged the two ranks' gradients
    assert torch.allclose(first[0], torch.full((2, 4), 3.0))  # d(sum)/dW: 2 rows x mean(1, 2)


def _check_compressor_hook(text: str, tmp: Path) -> None:
    """PowerSGD rank 2 of a 2 x 4 weight is not the mean itself, but every rank applies the
    same decoded sum: the gradients are equal across ranks and finite."""
    import torch

    first, second = _in_world(text, tmp, _after_ddp_hook)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b) and bool(torch.isfinite(a).all())


def _check_horovod_launch(text: str, tmp: Path) -> None:
    """Horovod's MNIST example (tests/horovod/examples, torchvision's offline stand-in) in
    the folder it is run from, by both launchers, the venv's tools first on PATH."""
    shutil.copy(HOROVOD / "examples" / "pytorch_mnist.py", tmp)
    env = {
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(HOROVOD / "standins")]),
        "HOME": str(tmp),  # the example locks ~/.horovod_lock
        "PET_MASTER_PORT": str(free_port()),  # torchrun's 29500 may be another test's
    }
    for done in _at_once(_commands(text), tmp, {**os.environ, **env}, 300):
        assert "Test set: Average loss" in done.stdout, _failed(done.args, done)


def _check_compare(text: str, tmp: Path) -> None:
    (argv,) = (_disttrain_args(a) for a in _commands(text))
    args = _budgeted(argv, tmp)
    done = run_cli(*args, timeout=240)
    assert done.returncode == 0, _failed(args, done)
    out = Path(args[args.index("--out") + 1])
    specs = [s.strip() for s in argv[argv.index("--strategies") + 1].split(",")]
    runs = json.loads((out / "runs.json").read_text())
    assert [r["label"] for r in runs] == specs and not any(r["error"] for r in runs)
    for run in runs:
        _summary(out / run["folder"])
    report = (out / "report.md").read_text()
    assert all(f"| {spec} | ok |" in report for spec in specs), report
    assert (out / "report.html").stat().st_size > 0
    plots = ("loss_vs_epoch", "loss_vs_time", "accuracy_vs_time", "accuracy_vs_bytes", "throughput")
    for plot in plots:  # the plots docs/lab.md lists
        assert (out / f"{plot}.png").stat().st_size > 0, plot


def _check_advise(text: str, tmp: Path) -> None:
    """From ``tmp``: ``my.json`` is the repository's calibration, and ``rows.json`` lands
    there. ``--calibrate`` is parsed only: minutes of benches, saved into the user's cache."""
    shutil.copy(CALIBRATION, tmp / "my.json")
    here = os.getcwd()
    os.chdir(tmp)
    try:
        for argv in _commands(text):
            args = _disttrain_args(argv)
            if "--calibrate" in args:
                _accepts(args)
                continue
            code, out, err = _in_process(args)
            assert code == 0, (args, err)
            last = out.strip().splitlines()[-1]
            assert last.startswith("recommendation: for "), (args, last)
            if "--memory-per-worker" in args:
                assert " per worker: " in last, last  # "picks the fastest row that fits"
            if "--json" in args:
                assert json.loads((tmp / args[args.index("--json") + 1]).read_text())
    finally:
        os.chdir(here)


def _check_scenario(text: str, tmp: Path) -> None:
    """From the repository, in-process: the prediction's JSON has the issue's four keys;
    ``bench published`` prints both blocks and the held-out median."""
    here = os.getcwd()
    os.chdir(REPO)
    try:
        for argv in _commands(text):
            args = _budgeted(_disttrain_args(argv), tmp)
            code, out, err = _in_process(args)
            assert code == 0, (args, err)
            if "--json" in args:
                got = json.loads(Path(args[args.index("--json") + 1]).read_text())
                keys = {"samples_per_second", "scaling_efficiency", "step_seconds", "breakdown"}
                assert set(got) == keys, got
                assert round(got["samples_per_second"]) == 136325  # "It predicts 136,325"
            if args[:2] == ["bench", "published"]:
                assert "## calibration rows" in out and "held-out rows:" in out, out[-500:]
    finally:
        os.chdir(here)


def _check_scenario_file(text: str, tmp: Path) -> None:
    """The block is the example file: both parse to the same scenario."""
    import tomllib

    from disttrain.lab.scenario import load, parse

    del tmp
    shown = parse(tomllib.loads(text), "docs/lab.md")
    assert shown == load(str(REPO / "examples" / "scenario_bert_large.toml"))


def _check_measured_block(text: str, tmp: Path) -> None:
    """The example file with this block in place of its one-GPU rate: advise prints the
    line the text quotes, and the rate it backs out predicts the timed run."""
    import tomllib

    data = tomllib.loads((REPO / "examples" / "scenario_bert_large.toml").read_text())
    del data["hardware"]["gpu_samples_per_second"]
    lines = [f"[{t}]\n" + "".join(f"{k} = {v!r}\n" for k, v in data[t].items()) for t in data]
    path = tmp / "measured.toml"
    path.write_text("".join(lines).replace("'", '"') + text)
    code, out, err = _in_process(["advise", "--scenario", str(path)])
    assert code == 0, err
    assert "one-GPU rate 581.1 samples/s, backed out of the measured run: 8 GPUs" in out, out


def _check_costmodel_api(text: str, tmp: Path) -> None:
    """In this process: ``DEFAULT_PATH`` (the user's saved calibration) is the repository's
    calibration; ``specs`` is the reader's (two specs)."""
    from disttrain.lab import calibration
    from disttrain.strategies.spec import parse_specs

    saved = calibration.DEFAULT_PATH
    calibration.DEFAULT_PATH = str(CALIBRATION)
    ns: dict[str, Any] = {"specs": parse_specs("allreduce:ring, zero:3", model=True)}
    try:
        exec(compile(text, "docs/lab.md", "exec"), ns)
    finally:
        calibration.DEFAULT_PATH = saved
    p, m, rows = ns["p"], ns["m"], ns["rows"]
    ranked = _value_of(text, "costmodel.rank(", ns)  # "fastest first"
    assert [r.step_seconds for r in ranked] == sorted(r.step_seconds for r in ranked)
    fit = _value_of(text, "costmodel.fitting(rows)", ns)  # "the modelled rows that fit, fastest"
    assert all(r.step is not None and r.fits is not False for r in fit)
    assert [r.step.step_seconds for r in fit] == sorted(r.step.step_seconds for r in fit)
    seconds, _ = _value_of(text, "costmodel.allreduce_seconds(", ns)  # (seconds, its Path)
    assert seconds > 0
    assert math.isfinite(p.step_seconds) and p.step_seconds > p.compute_seconds > 0
    assert m.total >= m.parameters + m.gradients + m.optimizer_state > 0
    assert [r.label for r in rows] == ["allreduce:ring", "zero:3"]


def _check_timeline(text: str, tmp: Path) -> None:
    """Each trace parses; each rank is a process ``rank N``; allreduce buckets appear in
    the data-parallel run, the pipeline's send/recv waits in the pipeline run."""
    for argv in _commands(text):
        args = _budgeted(_disttrain_args(argv), tmp)
        done = run_cli(*args, timeout=180)
        assert done.returncode == 0, _failed(args, done)
        trace = json.loads(Path(args[args.index("--timeline") + 1]).read_text())
        events = trace["traceEvents"]
        ranks = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
        assert ranks == {"rank 0", "rank 1"}, ranks
        names = {e.get("name") for e in events}
        wanted = "send/recv" if "pipeline" in args else "allreduce bucket 0"
        assert {"step", "forward", "backward", wanted} <= names, names


def _check_entry_point(text: str, tmp: Path) -> None:
    results = _in_world(text, tmp, _after_entry)
    _check_summaries([r["summary"] for r in results])
    assert results[0]["written"]  # "out": "runs/x", from the process's folder


def _check_ps_async(text: str, tmp: Path) -> None:
    (argv,) = _commands(text)
    s = _train(_disttrain_args(argv), tmp)
    c = s["config"]
    assert (s["strategy"], c["ps_mode"], c["workers"], c["servers"], c["staleness_lr"]) == (
        "ps",
        "async",
        4,
        2,
        True,
    )


def _check_ps_curve(text: str, tmp: Path) -> None:
    """The key is written from ``tmp``; the run reads it (``...``: the rest of a run's
    flags, none here)."""
    keygen, run = _commands(text)
    assert keygen[:3] == ["python", "-m", "disttrain.ps.keygen"], keygen
    done = _sh([sys.executable, *keygen[1:]], tmp, timeout=60)
    assert done.returncode == 0, _failed(keygen, done)
    key = tmp / keygen[3]
    assert key.stat().st_mode & 0o777 == 0o600  # "owner-only"
    assert re.fullmatch(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}", key.read_text().strip())
    args = [a for a in _disttrain_args(run) if a != "..."]
    args[args.index("--ps-curve-key") + 1] = str(key)
    assert _train(args, tmp)["strategy"] == "ps"


def _check_zero(text: str, tmp: Path) -> None:
    (argv,) = _commands(text)
    s = _train(_disttrain_args(argv), tmp)
    assert (s["strategy"], s["config"]["zero_stage"], s["world_size"]) == ("zero", 2, 4)
    assert len(s["memory_per_rank"]["optimizer_state"]) == 4


def _after_pipeline_any(code: str, ns: dict[str, Any]) -> Any:
    return {"loss": float(ns["loss"]), "stage": ns["run"].strategy.stage}


def _check_pipeline_any(text: str, tmp: Path) -> None:
    """The 3 lines, after a header that builds what they name (the imports, token ids), in
    a 2-rank world: two stages, the same finite loss (the model's own) logged on both."""
    header = (
        "import torch\n"
        "from transformers import GPT2Config, GPT2LMHeadModel\n"
        "import disttrain as dt\n"
        "torch.manual_seed(0)\n"
        "ids = torch.randint(0, 256, (8, 16))\n"
    )
    assert len([line for line in text.splitlines() if line.strip()]) <= 3
    first, second = _in_world(header + text, tmp, _after_pipeline_any)
    assert (first["stage"], second["stage"]) == (0, 1)
    assert first["loss"] == second["loss"] and math.isfinite(first["loss"])


def _after_tensor_plan(code: str, ns: dict[str, Any]) -> Any:
    run = ns["run"]
    c_attn = run.model.transformer.h[0].attn.c_attn  # Conv1D (in, out): a third of q, k, v each
    whole = run.finish()  # collective: rank 0's model comes back whole
    shape = None if whole is None else tuple(whole.transformer.h[0].attn.c_attn.weight.shape)
    return {"loss": float(ns["loss"]), "slice": tuple(c_attn.weight.shape), "whole": shape}


def _check_tensor_plan(text: str, tmp: Path) -> None:
    """The 3 lines after the imports and token ids, in a 2-rank world: each rank holds half
    of every head's q, k, v, both log the same finite loss, rank 0 gets the whole model."""
    header = (
        "import torch\n"
        "from transformers import GPT2Config, GPT2LMHeadModel\n"
        "import disttrain as dt\n"
        "torch.manual_seed(0)\n"
        "ids = torch.randint(0, 256, (8, 16))\n"
    )
    assert len([line for line in text.splitlines() if line.strip()]) <= 3
    first, second = _in_world(header + text, tmp, _after_tensor_plan)
    assert first["slice"] == second["slice"] == (64, 96)
    assert (first["whole"], second["whole"]) == ((64, 192), None)
    assert first["loss"] == second["loss"] and math.isfinite(first["loss"])


def _check_sharded_api(text: str, tmp: Path) -> None:
    first, second = _in_world(text, tmp, _after_sharded)
    assert first == {"state": ["bias", "weight"], "optim": ["param_groups", "state"]}
    assert second == {"state": [], "optim": []}  # "rank 0: ..."


#: the launcher's last line for the replicated run (the block's comment, numbers aside)
OOM_LINE = re.compile(
    r"disttrain: error: rank (\d): OutOfMemory: out of memory on rank \1: could not allocate "
    r"[\d.,]+ MiB more, holding [\d.,]+ MiB resident \(peak [\d.,]+ MiB\); data limit "
    r"600.0 MiB \(RLIMIT_DATA\) \[worker rank \1 \(pid \d+\) exited with code 1; "
    r"3 other worker\(s\) stopped because of it\]"
)


def _check_wide_mlp(text: str, tmp: Path) -> None:
    """Under the block's RLIMIT_DATA: ZeRO stage 3 trains (exit 0), the replicated run
    fails (exit 1) with one line per rank, then the launcher's. ``prlimit``'s argument is
    shell arithmetic: bash runs each line, with disttrain's arguments under the budget."""
    env: dict[str, str] = {}
    runs = []
    for argv in _commands(text):
        if argv[0] == "export":
            name, value = argv[1].split("=", 1)
            env[name] = value
            continue
        i = argv.index("disttrain")
        args = _budgeted(argv[i + 1 :], tmp)
        shell = " ".join(argv[:i]) + ' "$@"'  # `prlimit --data=$((600 * 2**20)) "$@"`
        runs.append(
            (
                args,
                _sh(
                    ["bash", "-c", shell, "bash", sys.executable, "-m", "disttrain", *args],
                    REPO,
                    env=env,
                    timeout=240,
                ),
            )
        )
    (fits, done), (oom, failed) = runs
    assert done.returncode == 0, _failed(fits, done)
    assert _summary(Path(fits[fits.index("--out") + 1]))["config"]["zero_stage"] == 3
    assert failed.returncode == 1, _failed(oom, failed)
    lines = failed.stderr.strip().splitlines()
    last = OOM_LINE.fullmatch(lines[-1])
    assert last, lines[-1]
    # "one line per rank": each rank that got to its allocation says so; a rank the
    # launcher stopped first (it lagged on a loaded machine) has nothing to say
    rank_line = re.compile(r"disttrain: rank (\d): OutOfMemory: out of memory on rank \1: ")
    per_rank = [int(m[1]) for line in lines[:-1] if (m := rank_line.match(line))]
    assert int(last[1]) in per_rank and len(per_rank) == len(set(per_rank)) <= 4, lines


# --- the table: one entry per block -------------------------------------------------------

RUN = "run (budget)"
ENTRIES: list[Entry] = [
    Entry("README.md", "make train", "Makefile targets exist; make -n train/test", _check_make, 90),
    Entry(
        "README.md",
        ".venv/bin/disttrain train --workers 4 --model cnn",
        f"{RUN}: cnn on 4 workers, --config + --lr (flag wins); --help in-process",
        _check_readme_train,
        300,
    ),
    Entry("README.md", "# mymodels.py", "not a command: the file the next block trains"),
    Entry(
        "README.md",
        "disttrain train --model mymodels:make",
        f"{RUN}: the block above written to tmp as mymodels.py, the command from there",
        _check_own_model,
        180,
    ),
    Entry(
        "README.md",
        "# the same command on each of 2 nodes",
        "parsed: disttrain's parser + config; torchrun's parser",
        _check_multinode,
    ),
    Entry(
        "README.md",
        "# this machine (torch's agent)",
        f"{RUN}: local; ray parsed; sbatch script run with a stub python, its command "
        "parsed; k8s yaml parsed, its commands parsed; python -c in a 2-rank world",
        _check_engines,
        300,
    ),
    Entry("README.md", "import disttrain as dt", "exec in a 2-rank world", _check_readme_api, 180),
    Entry(
        "README.md",
        "run = dt.distribute(model, optimizer",
        "not a command: the loop's shape (docs/your-loop.md's blocks run, every strategy)",
    ),
    Entry(
        "README.md",
        "disttrain train --dataset examples.workloads:regression",
        f"{RUN}: the CSV regression and GPT-2 with ZeRO-3 (budgeted): no accuracy, finite loss",
        _check_user_workloads,
        240,
    ),
    Entry("docs/architecture.md", "make shape", f"{RUN}: every figure printed", _check_shape),
    Entry(
        "docs/cluster.md",
        "sudo disttrain cluster up",
        "parsed (needs root): each verb and the command after run --",
        _check_cluster,
    ),
    Entry("docs/cluster.md", "namespace dt-main-h0", "not a command: a diagram of the namespaces"),
    Entry(
        "docs/cluster.md",
        "--nnodes H --node-rank I",
        "not a command: the flags `cluster run` appends (H, I, PID stand for numbers)",
    ),
    Entry(
        "docs/collectives.md",
        "disttrain bench ring-segments",
        "parsed: a benchmark of minutes (tests/lab/bench/test_modules.py runs it small)",
        _check_parsed,
    ),
    Entry(
        "docs/compression.md",
        "from disttrain.dataparallel.ddp_hooks import CompressorHook",
        "exec in a 2-rank world, then one step: the gradients of both ranks equal",
        _check_compressor_hook,
        180,
    ),
    Entry(
        "docs/compression.md",
        "warning: --compression onebit:0.5 sent 0",
        "not a command: output (tests/compression/test_starved.py checks it)",
    ),
    Entry(
        "docs/compression.md",
        "disttrain train --workers 4 --strategy localsgd --period 16",
        f"{RUN}: each train line and example, at once; benches and sudo parsed "
        "(tests/lab/bench runs them small)",
        _run_all,
        300,
    ),
    Entry(
        "docs/collectives.md",
        "from disttrain import collectives",
        "exec in a 2-rank world: tensor holds the sum",
        _check_collectives,
        180,
    ),
    Entry(
        "docs/data-parallel.md",
        "backward:   last layer's grad ready",
        "not a command: a diagram of one step",
    ),
    Entry(
        "docs/data-parallel.md",
        "import disttrain as dt",
        "exec in a 2-rank world: the ranks' parameters equal after it",
        _check_horovod_api,
        180,
    ),
    Entry(
        "docs/data-parallel.md",
        "GLOO_SOCKET_IFNAME=lo torchrun",
        "parsed by torchrun (its fixed port would collide in a parallel suite): "
        "tests/test_api.py runs examples/horovod_style.py under torchrun",
        _check_parsed,
    ),
    Entry(
        "docs/data-parallel.md",
        "disttrain bench dp --workers 2 --model mlp|cnn|gpt",
        "parsed, each model of the synopsis: tests/lab/bench runs the benchmark small",
        _check_parsed,
    ),
    Entry(
        "docs/model-parallel.md",
        "train --strategy pipeline --workers 2 --schedule 1f1b",
        f"{RUN}: each train line, at once; the pipeline benches parsed "
        "(tests/lab/bench/test_pipeline.py runs them small)",
        _run_all,
        300,
    ),
    Entry(
        "docs/model-parallel.md",
        "model = GPT2LMHeadModel(GPT2Config(",
        "exec in a 2-rank world after the imports, ids and loss: one step on 2 stages",
        _check_pipeline_any,
        180,
    ),
    Entry(
        "docs/model-parallel.md",
        "gpt2 = GPT2LMHeadModel(GPT2Config(",
        "exec in a 2-rank world after the imports and ids: one step of GPT-2 cut by its plan",
        _check_tensor_plan,
        180,
    ),
    Entry(
        "docs/reliability.md",
        "disttrain: error: worker rank 1 (pid 8898) was killed",
        "not a command: output (tests/train/test_faults.py checks it)",
    ),
    Entry(
        "docs/reliability.md",
        "disttrain: error: rank 1: NonFiniteGradient",
        "not a command: output (tests/train/test_faults.py checks it)",
    ),
    Entry(
        "docs/reliability.md",
        "disttrain: error: rank 0: OutOfMemory",
        "not a command: output (the zero.md block's check matches it)",
    ),
    Entry(
        "docs/reliability.md",
        "gloo failed to connect the ranks (connectFullMesh failed",
        "not a command: output (tests/comm/test_forming.py checks it)",
    ),
    Entry(
        "docs/reliability.md",
        "disttrain: error: worker rank 1 (pid 13789) hung",
        "not a command: output (tests/train/test_faults.py checks it)",
    ),
    Entry(
        "docs/reliability.md",
        "ranks called different collectives",
        "not a command: output (tests/collectives/test_checks.py checks it)",
    ),
    Entry(
        "docs/reliability.md",
        "disttrain: error: --out runs/a already holds checkpoints",
        "not a command: output (out-of-another-run in tests/test_bad_inputs.py)",
    ),
    Entry(
        "docs/reliability.md",
        "disttrain train --workers 3 --min-workers 2",
        "parsed: the live shrink it shows is tests/train/test_shrink.py's (alone: its 3 s "
        "answer window), the output lines below it as there",
        _check_parsed,
    ),
    Entry(
        "docs/reliability.md",
        "disttrain: error: rank 0: lost rank(s) 1, 2",
        "not a command: output (tests/train/test_shrink.py checks it)",
    ),
    Entry(
        "docs/reliability.md",
        "disttrain train --workers 2 --max-workers 3",
        "parsed: the live grow it shows is tests/train/test_grow.py's (alone)",
        _check_parsed,
    ),
    Entry(
        "docs/reliability.md",
        "disttrain: interrupted at step 212",
        "not a command: output (tests/launch/test_job.py checks it)",
    ),
    Entry(
        "docs/data-parallel.md",
        "from disttrain.dataparallel.ddp_hooks import AlgorithmHook",
        "exec in a 2-rank world, then one step: averaged gradients",
        _check_ddp_hook,
        180,
    ),
    Entry(
        "docs/gpu.md",
        "make gpu-proof",
        "needs a GPU: make -n gpu-proof; bash -n its script",
        _check_make,
        90,
    ),
    Entry(
        "docs/your-loop.md",
        "import torch",
        "exec in a 2-rank world: the plain loop learns",
        _check_plain_loop,
        120,
    ),
    Entry(
        "docs/your-loop.md",
        "import disttrain as dt",
        "exec on 2 ranks once per registered strategy: rank 0's whole model learned",
        _check_every_strategy_block,
        300,
    ),
    Entry(
        "docs/horovod.md",
        "import horovod.torch as hvd",
        "not a command: the import line before and after",
    ),
    Entry(
        "docs/horovod.md",
        "disttrain run -np 2 python pytorch_mnist.py",
        "run: Horovod's MNIST example by disttrain run and by torchrun",
        _check_horovod_launch,
        360,
    ),
    Entry(
        "docs/lab.md",
        'disttrain compare --strategies "allreduce:ring, ps:async',
        f"{RUN}: report.md, report.html, runs.json, plots",
        _check_compare,
        420,
    ),
    Entry(
        "docs/lab.md",
        "sudo disttrain cluster up --hosts 4 --bandwidth 100mbit",
        "parsed (needs root)",
        _check_cluster,
    ),
    Entry(
        "docs/lab.md",
        "disttrain advise --params 25M --nodes 256",
        "run in-process: a recommendation each; rows.json; --calibrate parsed",
        _check_advise,
        120,
    ),
    Entry(
        "docs/lab.md",
        "disttrain advise --scenario examples/scenario_bert_large.toml",
        "run in-process: the prediction's four JSON keys; bench published's blocks",
        _check_scenario,
        60,
    ),
    Entry(
        "docs/lab.md",
        "# examples/scenario_bert_large.toml",
        "parsed: the same scenario as examples/scenario_bert_large.toml",
        _check_scenario_file,
        30,
    ),
    Entry(
        "docs/lab.md",
        "[measured]",
        "the example file with this block for its rate: advise prints the quoted line",
        _check_measured_block,
        30,
    ),
    Entry(
        "docs/lab.md",
        "from disttrain.lab import costmodel",
        "exec in-process (the repository's calibration as the saved one)",
        _check_costmodel_api,
    ),
    Entry(
        "docs/lab.md",
        "disttrain train --workers 2 --max-steps 20 --fusion-mb 0.5",
        f"{RUN}: each trace parses, ranks and spans",
        _check_timeline,
        240,
    ),
    Entry(
        "docs/launching.md",
        "import torch.distributed as dist, disttrain",
        "exec in a 2-rank world (the group exists)",
        _check_entry_point,
        180,
    ),
    Entry(
        "docs/parameter-server.md",
        "disttrain train --strategy ps --ps-mode async",
        f"{RUN}: summary with the settings",
        _check_ps_async,
        180,
    ),
    Entry(
        "docs/parameter-server.md",
        "python -m disttrain.ps.keygen job.key",
        f"key written (0600, 40 Z85 characters); {RUN} with it",
        _check_ps_curve,
        240,
    ),
    Entry(
        "docs/zero.md",
        "disttrain train --strategy zero --zero-stage 2",
        f"{RUN}: summary with the settings",
        _check_zero,
        180,
    ),
    Entry(
        "docs/zero.md",
        "import disttrain as dt",
        "exec in a 2-rank world: full state on rank 0",
        _check_sharded_api,
        180,
    ),
    Entry(
        "docs/zero.md",
        "export MALLOC_MMAP_THRESHOLD_",
        f"{RUN} under the limit: stage 3 exit 0; replicated exit 1 with the OOM line",
        _check_wide_mlp,
        180,  # ~17 CPU-s since the 8-layer example: no longer scheduled first
    ),
]
BLOCKS = _blocks()


def test_every_block_has_exactly_one_entry() -> None:
    problems = []
    for block in BLOCKS:
        hits = [e for e in ENTRIES if e.matches(block)]
        where = f"{block.file}:{block.line}: the block starting {block.first!r}"
        if not hits:
            problems.append(f"{where} has no entry: add an entry to ENTRIES in {__name__}")
        elif len(hits) > 1:
            problems.append(f"{where} matches {len(hits)} entries: make their keys distinct")
    for entry in ENTRIES:
        if not any(entry.matches(block) for block in BLOCKS):
            problems.append(f"stale entry: no first line in {entry.file} holds {entry.key!r}")
    assert not problems, "\n".join(problems)


def _cases() -> list[Any]:
    """Longest first (the timeouts rank the costs), so that -n 3 does not end on one."""
    checked = sorted((e for e in ENTRIES if e.check), key=lambda e: -e.timeout)
    return [
        pytest.param(e, id=f"{e.file}:{e.key[:40]}", marks=pytest.mark.timeout(e.timeout))
        for e in checked
    ]


@pytest.mark.parametrize("entry", _cases())
def test_block_does_what_the_text_says(entry: Entry, tmp_path: Path) -> None:
    blocks = [b for b in BLOCKS if entry.matches(b)]
    assert len(blocks) == 1, f"{entry.file}: {entry.key!r} matches {len(blocks)} blocks"
    assert entry.check is not None
    entry.check(blocks[0].text, tmp_path)
