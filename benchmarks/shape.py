"""The code's shape in the figures issue 37 sets targets for: ``make shape`` prints them.

- members of the plugin bases (methods, properties and class attributes they define,
  defaults included), and how many of them one plugin alone overrides;
- trainer.py's lines, and every function in src/ over 60 lines;
- ``# fmt: skip`` markers in src/ and tests/; benchmarks/RESULTS.md's lines.

Read from the source (``ast``) and the registries; nothing runs.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "disttrain"
LONG = 60  # lines: issue 37's limit for a function
TARGETS = {"Strategy": 12, "AllReduceAlgorithm": 10, "Compressor": 10}
#: base class -> (its module, the registry of its plugins: module, name)
BASES = {
    "Strategy": ("disttrain.strategies.base", ("disttrain.strategies", "STRATEGIES")),
    "AllReduceAlgorithm": ("disttrain.collectives.base", ("disttrain.collectives", "ALGORITHMS")),
    "Compressor": ("disttrain.compression.base", None),
}


def members(cls: type) -> set[str]:
    """What ``cls`` itself defines: methods, properties, class attributes (not dunders)."""
    own = set(vars(cls)) | set(getattr(cls, "__annotations__", {}))
    return {m for m in own if not (m.startswith("__") and m.endswith("__"))}


def _plugins(base: type, registry: tuple[str, str] | None) -> list[type]:
    import importlib

    if registry is None:  # every subclass loaded
        todo, found = [base], []
        while todo:
            for sub in todo.pop().__subclasses__():
                found.append(sub)
                todo.append(sub)
        return found
    module, name = registry
    entries = getattr(importlib.import_module(module), name)
    # a registry holds each plugin's descriptor (its kind): the runtime class is its part
    return [getattr(entries.get(n), "runtime", entries.get(n)) for n in entries]


def base_rows() -> Iterator[str]:
    import importlib

    from disttrain.registry import load_plugins

    load_plugins()
    importlib.import_module("disttrain.compression.registry")  # every compressor's file
    for name, (module, registry) in BASES.items():
        base = getattr(importlib.import_module(module), name)
        own = members(base)
        plugins = _plugins(base, registry)
        overriders = {m: [p for p in plugins if m in vars(p)] for m in own}
        alone = sorted(m for m, ps in overriders.items() if len(ps) == 1)
        yield (
            f"{name}: {len(own)} members (target <= {TARGETS[name]}); overridden by one "
            f"plugin alone: {len(alone)} ({', '.join(alone) or '-'})"
        )


def long_functions() -> list[tuple[int, str]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > LONG:
                    where = f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"
                    out.append((length, where))
    return sorted(out, reverse=True)


def fmt_skips() -> int:
    files = [*SRC.rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    return sum(p.read_text().count("# fmt: skip") for p in files)


def main() -> int:
    sys.path.insert(0, str(ROOT / "src"))
    for row in base_rows():
        print(row)
    trainer = SRC / "train" / "trainer.py"
    print(f"train/trainer.py: {len(trainer.read_text().splitlines())} lines (target <= 250)")
    long = long_functions()
    print(f"functions over {LONG} lines in src: {len(long)} (target 0)")
    for length, where in long:
        print(f"  {length:4d}  {where}")
    print(f"'# fmt: skip' in src and tests: {fmt_skips()} (target <= 20)")
    results = ROOT / "benchmarks" / "RESULTS.md"
    print(f"benchmarks/RESULTS.md: {len(results.read_text().splitlines())} lines (target <= 400)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
