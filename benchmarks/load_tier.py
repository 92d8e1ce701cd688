"""Issue 51's load tier: live shrink beside two CPU-bound processes, many times.

    .venv/bin/python benchmarks/load_tier.py --runs 20 --faults kill,stop

Each run is the issue's command (``disttrain train --workers 4 --epochs 4 --batch-size 96
--timeout 10 --min-workers 3 --inject-fault FAULT:rank=2:step=30``) with two
``python3 -c 'while True: pass'`` beside it, started before the run and killed after it.
``stop`` SIGSTOPs rank 2 (its heartbeat thread too) past the heartbeat timeout instead of
killing it. A run passes when it exits 0, its metrics hold every step once (1..last, no
step twice), it ends with 3 workers, and no process of it is left. The reference is the
same command without a fault, beside the same two processes, run first: each run's final
test accuracy is reported against it (the issue's "within 1 point").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from disttrain.launch import commands, tether

COMMAND = ["--workers", "4", "--epochs", "4", "--batch-size", "96", "--timeout", "10"]
COMMAND += ["--min-workers", "3", "--no-progress", "--overwrite"]


@contextlib.contextmanager
def beside_hogs(n: int) -> Iterator[None]:
    """``n`` CPU-bound ``python3 -c 'while True: pass'`` running for the block, SIGKILLed
    after it, and by the kernel if this process dies first (launch/tether.py)."""
    me = os.getpid()
    hogs = [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"], preexec_fn=lambda: tether.tie(me)
        )
        for _ in range(n)
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.send_signal(signal.SIGKILL)
            hog.wait()


def _run(out: Path, fault: str | None) -> dict[str, object]:
    """One run beside two hogs: its exit code, steps, workers, accuracy and seconds."""
    flags = [*COMMAND, "--out", str(out)]
    if fault:
        flags += ["--inject-fault", f"{fault}:rank=2:step=30"]
    start = time.monotonic()
    with beside_hogs(2):  # the command is tied to this process too (launch/commands.py)
        done = commands.run(["train", *flags], timeout=900, capture_output=True, text=True)
    row: dict[str, object] = {"code": done.returncode, "seconds": time.monotonic() - start}
    if done.returncode != 0:
        row["error"] = done.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
        return row
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]  # a step's row (not an epoch's test row)
    summary = json.loads((out / "summary.json").read_text())
    row["steps_once"] = sorted(set(steps)) == list(range(1, max(steps) + 1)) and len(
        set(steps)
    ) == len(steps)
    row["last_step"] = max(steps)
    row["workers_at_end"] = summary.get("workers_at_end", summary.get("workers"))
    row["accuracy"] = summary["final_accuracy"]
    row["left"] = _left(out)
    return row


def _left(out: Path) -> list[int]:
    """Live processes whose command line names this run's folder."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if str(out).encode() in cmd:
                found.append(int(entry))
    return found


def _passed(row: dict[str, object]) -> bool:
    return row["code"] == 0 and bool(row.get("steps_once")) and not row.get("left")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--faults", default="kill,stop")
    ap.add_argument("--out", type=Path, default=Path("/tmp/load-tier"))
    a = ap.parse_args()
    reference = _run(a.out / "reference", None)
    print(f"reference (no fault, beside 2 hogs): {json.dumps(reference)}", flush=True)
    for fault in a.faults.split(","):
        rows = []
        for i in range(a.runs):
            row = _run(a.out / f"{fault}-{i}", fault)
            load = Path("/proc/loadavg").read_text().split()[:3]
            print(f"{fault} {i}: {json.dumps(row)} load {' '.join(load)}", flush=True)
            rows.append(row)
        passed = [r for r in rows if _passed(r)]
        gaps = [abs(float(r["accuracy"]) - float(reference["accuracy"])) for r in passed]  # type: ignore[arg-type]
        worst = f"{max(gaps):.4f}" if gaps else "-"
        within = sum(g <= 0.01 for g in gaps)
        print(
            f"{fault}: {len(passed)}/{len(rows)} passed (exit 0, every step once, nothing left); "
            f"accuracy within 1 point of the reference {reference.get('accuracy')}: "
            f"{within}/{len(passed)}, worst gap {worst}",
            flush=True,
        )


if __name__ == "__main__":
    main()
