"""A failed allocation is one line naming the rank, the bytes asked and the process's limit."""

from __future__ import annotations

import subprocess
import sys

from disttrain.train.oom import as_out_of_memory

# torch's own words, checked against a real allocation below
TORCH = (
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
    "memory: you tried to allocate 2097152000 bytes. Error code 12 (Cannot allocate memory)"
)


def test_an_allocation_failure_names_the_rank_and_the_bytes() -> None:
    oom = as_out_of_memory(RuntimeError(TORCH), 3)
    assert oom is not None
    text = str(oom)
    assert "out of memory on rank 3: could not allocate 2,000.0 MiB more" in text
    assert "\n" not in text
    assert as_out_of_memory(RuntimeError("shape mismatch"), 3) is None


def test_a_real_allocation_over_a_data_limit_is_recognised() -> None:
    """Under RLIMIT_DATA = 1 GiB, torch refuses a 2 GB tensor with the message above."""
    code = (
        "import resource, torch\n"
        "from disttrain.train.oom import as_out_of_memory\n"
        "resource.setrlimit(resource.RLIMIT_DATA, (2**30, resource.RLIM_INFINITY))\n"
        "try:\n"
        "    torch.empty(2**29)\n"
        "except RuntimeError as exc:\n"
        "    print(as_out_of_memory(exc, 1))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("out of memory on rank 1: could not allocate 2,048.0 MiB more"), line
    assert "data limit 1,024.0 MiB (RLIMIT_DATA)" in line
