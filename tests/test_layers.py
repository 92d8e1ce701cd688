"""The layers of docs/architecture.md, enforced: a module imports only its own layer or lower,
and no two packages (nor two modules) import each other, directly or through others.

Every ``import`` and ``from ... import`` of ``disttrain`` in src/ counts, wherever it
stands: at the top, inside a function (a lazy import is still a dependency, only a
later one) and under ``if TYPE_CHECKING:`` (a lower layer that names an upper one's
types knows about it, and a cycle through annotations is still a cycle for a reader
and for mypy). ``from pkg import name`` is an import of ``pkg.name`` when that is a
module, else of ``pkg``. The implicit import of a parent package's ``__init__`` is not
counted (every module would otherwise depend on ``disttrain/__init__``, the API).

The table below is the one place the layers are written; the table in
docs/architecture.md mirrors it (checked here).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "disttrain"
DOC = ROOT / "docs" / "architecture.md"

#: LAYERS[n]: the units of layer Ln (a unit is a top-level package or module of
#: disttrain; ``disttrain`` itself is the API's ``__init__``). A unit may import units
#: of its own layer (without a cycle) and of lower layers, never of higher ones.
LAYERS: tuple[tuple[str, ...], ...] = (
    # L0: no disttrain imports but each other's
    (
        "disttrain.registry",
        "disttrain.comm",
        "disttrain.timeline",
        "disttrain.config",
        "disttrain.checkpoint",
        "disttrain.units",
        "disttrain.factories",
        "disttrain.batch",
        "disttrain.lean",
    ),
    # L1: the building blocks over the wire and over the data
    (
        "disttrain.collectives",
        "disttrain.compression",
        "disttrain.amp",
        "disttrain.data",
        "disttrain.models",
    ),
    # L2: the machinery strategies are built from
    (
        "disttrain.dataparallel",
        "disttrain.ps",
        "disttrain.parallel",
        "disttrain.costing",
        "disttrain.calibration",
    ),
    # L3: how replicas agree, one file per strategy
    ("disttrain.strategies",),
    # L4: the trainer loop
    ("disttrain.train",),
    # L5: starting jobs, the emulated cluster, benchmarks and reports, and the API pieces
    # those benchmarks measure (dt.DistributedOptimizer, dt's ops, the Horovod API)
    (
        "disttrain.launch",
        "disttrain.cluster",
        "disttrain.lab",
        "disttrain.optimizer",
        "disttrain.api",
        "disttrain.ops",
        "disttrain.horovod",
    ),
    # L6: the command and the package's own API (import disttrain as dt)
    (
        "disttrain.cli",
        "disttrain.__main__",
        "disttrain",
        "disttrain.elastic",
        "disttrain.sharded",
    ),
)

#: Module cycles tolerated for now, each as the set of its modules.
KNOWN_MODULE_CYCLES: list[frozenset[str]] = []

LAYER_OF = {unit: n for n, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: Iterable[str]) -> dict[str, int]:
    """Every disttrain module ``name`` imports -> the first line that does."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        if target.split(".")[0] == "disttrain" and target != name:
            found.setdefault(target, line)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: ``from . import x``, ``from ..a import b``
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                add(sub if sub in known else source, node.lineno)
    return found


def unit_of(module: str) -> str:
    """``disttrain.parallel.pipeline.runner`` -> ``disttrain.parallel``."""
    return ".".join(module.split(".")[:2])


def import_graph() -> dict[str, dict[str, int]]:
    modules = all_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    bad = []
    for module, targets in graph.items():
        for target, line in targets.items():
            here, there = LAYER_OF[unit_of(module)], LAYER_OF[unit_of(target)]
            if there > here:
                bad.append(f"{module}:{line} (L{here}) imports {target} (L{there})")
    return bad


def package_graph(graph: dict[str, dict[str, int]]) -> dict[str, set[str]]:
    units: dict[str, set[str]] = {}
    for module, targets in graph.items():
        edges = units.setdefault(unit_of(module), set())
        edges.update(unit_of(t) for t in targets if unit_of(t) != unit_of(module))
    return units


# --- the checker can fail --------------------------------------------------------------


def test_the_import_reader_counts_lazy_relative_and_type_checking_imports(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mod.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "import os\n"
        "from disttrain.comm import world\n"
        "from . import meter\n"
        "if TYPE_CHECKING:\n"
        "    from disttrain.train.trainer import train\n"
        "def f():\n"
        "    import disttrain.lab.compare\n"
        "    from disttrain.config import opt\n"
    )
    known = ["disttrain.comm.world", "disttrain.comm.meter", "disttrain.train.trainer"]
    got = imports_of("disttrain.comm.p2p", path, known)
    assert got == {
        "disttrain.comm.world": 3,
        "disttrain.comm.meter": 4,
        "disttrain.train.trainer": 6,
        "disttrain.lab.compare": 8,
        "disttrain.config": 9,
    }


def test_the_checks_find_an_upward_import_and_cycles_at_any_depth() -> None:
    graph = {
        "disttrain.comm.world": {"disttrain.train.step": 7},  # L0 -> L4
        "disttrain.train.step": {"disttrain.comm.world": 1},
    }
    assert upward_imports(graph) == [
        "disttrain.comm.world:7 (L0) imports disttrain.train.step (L4)"
    ]
    # a -> b -> c -> a: a cycle through a third package is found as one component
    three = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(three) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# --- the rules on src/ -----------------------------------------------------------------


def test_every_module_has_a_layer_and_every_unit_exists() -> None:
    units = {unit_of(m) for m in all_modules()}
    assert len(units) > 15, "too few units found: is SRC right?"
    assert units - set(LAYER_OF) == set(), "place these in LAYERS (tests/test_layers.py)"
    assert set(LAYER_OF) - units == set(), "LAYERS names units that no longer exist"


def test_no_module_imports_a_higher_layer() -> None:
    bad = upward_imports(import_graph())
    assert not bad, "upward imports (see docs/architecture.md):\n" + "\n".join(bad)


def test_no_two_packages_import_each_other() -> None:
    graph = import_graph()
    found = cycles(package_graph(graph))
    # each import between two packages of a cycle, where it stands
    edges = [
        f"  {module}:{line} imports {target}"
        for component in found
        for module, targets in graph.items()
        for target, line in targets.items()
        if unit_of(module) != unit_of(target)
        and {unit_of(module), unit_of(target)} <= set(component)
    ]
    assert not found, (
        f"packages that import each other (directly or via others): {found}\n" + "\n".join(edges)
    )


def test_no_two_modules_import_each_other() -> None:
    graph = {m: set(targets) for m, targets in import_graph().items()}
    every = cycles(graph)
    found = [c for c in every if frozenset(c) not in KNOWN_MODULE_CYCLES]
    assert not found, f"modules that import each other (directly or via others): {found}"
    stale = set(KNOWN_MODULE_CYCLES) - {frozenset(c) for c in every}
    assert not stale, f"fixed: remove {stale} from KNOWN_MODULE_CYCLES"


def test_the_architecture_doc_mirrors_the_table() -> None:
    """docs/architecture.md's layer table: rows ``| Ln | `disttrain.x`, ... | ... |``."""
    doc: dict[str, int] = {}
    for line in DOC.read_text().splitlines():
        row = re.match(r"\|\s*L(\d+)\s*\|([^|]*)\|", line)
        if row:
            for unit in re.findall(r"`([\w.]+)`", row.group(2)):
                doc[unit] = int(row.group(1))
    assert doc == LAYER_OF


def test_a_docstring_that_names_its_layer_names_the_right_one() -> None:
    """A unit's docstring may open with its layer (``L2: ...``); it must be the right one."""
    wrong = []
    for unit, layer in LAYER_OF.items():
        path = SRC.joinpath(*unit.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        said = re.match(r"L(\d+):", ast.get_docstring(ast.parse(path.read_text())) or "")
        if said and int(said.group(1)) != layer:
            wrong.append(f"{path.relative_to(ROOT)} says L{said.group(1)}, the table L{layer}")
    assert not wrong, "\n".join(wrong)


# --- the worker never imports the lab or the cluster -----------------------------------


def closure(graph: dict[str, dict[str, int]], start: Iterable[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(start)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


WORKER_ENTRY = ("disttrain.__main__", "disttrain.launch.job", "disttrain.launch.worker")


def test_the_worker_path_cannot_reach_the_lab_or_the_cluster() -> None:
    """Statically, lazy imports included: everything a worker could ever import."""
    reach = closure(import_graph(), WORKER_ENTRY)
    assert "disttrain.train.trainer" in reach  # the closure does follow the worker
    assert sorted(m for m in reach if unit_of(m) in ("disttrain.lab", "disttrain.cluster")) == []


def test_the_train_command_imports_no_lab_or_cluster_module() -> None:
    """At run time: parsing ``train`` and loading the worker's code, as a worker does."""
    code = (
        "import sys\n"
        "from disttrain.cli import build_parser\n"
        "build_parser('train').parse_args(['train', '--workers', '1'])\n"
        "import disttrain.launch.worker, disttrain.launch.supervise, disttrain.launch.rollcall\n"
        "import disttrain.train.trainer, disttrain.train.progress, disttrain.strategies\n"
        "print(sorted(m for m in sys.modules if m.startswith(('disttrain.lab', "
        "'disttrain.cluster'))))\n"
        "print('disttrain.launch.job' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["[]", "True"]
    helped = subprocess.run(
        [sys.executable, "-m", "disttrain", "train", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "--strategy" in helped.stdout


def test_strategies_never_import_the_data_package() -> None:
    """A strategy gets what it needs of the data from the trainer (the pipeline's time
    balance: ``prepare_model``'s sample), so a worker's strategy never loads a data set."""
    graph = import_graph()
    found = [
        f"{name} -> {target} (line {line})"
        for name, targets in graph.items()
        if unit_of(name) == "disttrain.strategies"
        for target, line in targets.items()
        if unit_of(target) == "disttrain.data"
    ]
    assert not found, found
