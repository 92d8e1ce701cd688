#!/usr/bin/env bash
# make gpu-proof: on a GPU machine (the device tool's H100/H200), run the CUDA tests with every
# candidate combination let through (DISTTRAIN_PROVING_GPU=1: pre-flight tries what a one-GPU
# machine can run, never several NCCL ranks), then the one-GPU benchmark, and print the rows
# for docs/gpu.md's "Proven combinations" table and gpu_support.PROVEN from the passed tests.
#
# Set-up on the bare machine: its own python3 and torch (not the CPU pin); the wheels under
# .whl (pyzmq for the parameter server) installed into /tmp/site. Outputs go to $OUT (the
# device tool's folder) or ./gpu-proof-out. Budget: about 8 minutes on one H100/H200.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-proof-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
WHEELS="${GPU_PROOF_WHEELS:-.whl}"  # the carried wheels (the GPU machine's Python 3.12)
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$WHEELS"/*.whl || exit 1
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD/src:$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
export DISTTRAIN_PROVING_GPU=1 DISTTRAIN_GPU_PROOF_LOG="$OUT/proof.jsonl"
rm -f "$DISTTRAIN_GPU_PROOF_LOG"
(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || echo "no GPU") | tee "$OUT/machine.txt"
"$PY" -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda,
    "python", sys.version.split()[0])' \
    | tee -a "$OUT/machine.txt"
# pytest-xdist (in the GPU image): the runs are mostly start-up and one GPU has room for many
XDIST=()
"$PY" -c 'import xdist' 2>/dev/null && XDIST=(-n "${GPU_PROOF_XDIST:-12}")
timeout "${GPU_PROOF_TEST_SECONDS:-300}" "$PY" -m pytest -q -p no:cacheprovider "${XDIST[@]}" \
    --timeout 240 --tb=line -rfs -o addopts="" tests/train/test_cuda.py 2>&1 \
    | tee "$OUT/tests_full.txt" | tail -80 > "$OUT/tests.txt"; cat "$OUT/tests.txt"
timeout "${GPU_PROOF_BENCH_SECONDS:-170}" "$PY" -m disttrain bench one-gpu --rounds 2 \
    --json "$OUT/one_gpu.json" 2>&1 | tail -8 | tee "$OUT/bench.txt"
# the same with torch.compile (inductor) on both sides: the MFU the issue asks about
timeout "${GPU_PROOF_COMPILED_SECONDS:-150}" "$PY" -m disttrain bench one-gpu --rounds 1 \
    --compile inductor --no-check-finite --json "$OUT/one_gpu_compiled.json" 2>&1 | tail -8 \
    | tee "$OUT/bench_compiled.txt"
"$PY" benchmarks/gpu_proof_rows.py "$DISTTRAIN_GPU_PROOF_LOG" "$OUT/machine.txt" \
    | tee "$OUT/rows.md"
