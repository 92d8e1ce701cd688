"""launch/malloc.py: a freed model-sized buffer is reused without fresh pages, unless the
user set glibc's own knobs. Each case runs in a process of its own (mallopt is global)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: four rounds of malloc, touch every page, free, of a 25.6 MB buffer (the default mlp's
#: flat gradient); prints [keep_freed_buffers()'s answer, faults of each round]. The module
#: is loaded from its file (argv[1]; it imports ctypes and os only): through the package,
#: ``disttrain.launch``'s __init__ would import torch, ~2.5 CPU-s in each of the 4 processes
_ROUNDS = """
import ctypes, importlib.util, json, resource, sys
spec = importlib.util.spec_from_file_location("malloc", sys.argv[1])
malloc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(malloc)
kept = malloc.keep_freed_buffers()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
faults = []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(25_600_000)
    libc.memset(p, 1, 25_600_000)
    libc.free(p)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps([kept, faults]))
"""


def _rounds(env: dict[str, str]) -> tuple[bool, list[int]]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    done = subprocess.run(
        [sys.executable, "-c", _ROUNDS, str(REPO / "src" / "disttrain" / "launch" / "malloc.py")],
        env={**clean, **env, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    kept, faults = json.loads(done.stdout)
    return kept, faults


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_buffer_is_reused_without_fresh_pages() -> None:
    kept, faults = _rounds({})
    pages = 25_600_000 // os.sysconf("SC_PAGE_SIZE")
    assert kept and faults[0] >= 0.9 * pages, faults  # the first round maps the heap
    assert max(faults[1:]) < 0.05 * pages, faults  # then its pages are reused
    # glibc's defaults: the buffer is a mapping of its own, and the next one faults again
    _, plain = _rounds({"MALLOC_TOP_PAD_": str(128 * 1024)})  # its default value
    assert plain[1] >= 0.9 * pages, plain


def test_the_users_own_malloc_settings_are_kept() -> None:
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        value = "glibc.malloc.trim_threshold=131072" if name == "GLIBC_TUNABLES" else "1048576"
        kept, _ = _rounds({name: value})
        assert not kept, name
