"""Print docs/gpu.md rows and gpu_support.PROVEN lines from a gpu-proof log (make gpu-proof).

    python benchmarks/gpu_proof_rows.py proof.jsonl machine.txt

Each line of the log is a test that passed on the GPU machine and the combination it proves
(tests/train/test_cuda.py, ``_record``). A combination is printed once, with every test that
proved it. Several NCCL ranks never appear: one GPU cannot prove them.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys


def main(log: str, machine_file: str) -> int:
    try:
        with open(log) as fh:
            passed = [json.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:  # no test passed (or none ran: no GPU)
        passed = []
    with open(machine_file) as fh:
        machine = "; ".join(line.strip() for line in fh if line.strip())
    commit = (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or "unknown"
    )
    today = datetime.date.today().isoformat()
    by_combo: dict[str, list[dict[str, str]]] = {}
    for entry in passed:
        by_combo.setdefault(entry["combination"], []).append(entry)
    for combo, entries in sorted(by_combo.items()):
        tests = "; ".join(f"`{e['test'].split('::', 1)[-1]}`: passed ({e['how']})" for e in entries)
        print(f"| `{combo}` | {tests} | {today} | {machine} | {commit} |")
    print(f"\n{len(by_combo)} combinations proven by {len(passed)} passed tests")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
