#!/bin/sh
# Third pass of the pipeline/tensor benchmarks (benchmarks/RESULTS.md, "Third pass").
# Each run writes output.txt (with `uptime` before and after), results.json and bubble.png.
# Usage: sh benchmarks/pipeline-third/run.sh full N | large N | wide N
set -e
kind=$1; n=$2
out=benchmarks/pipeline-third/$kind-$n
mkdir -p "$out"
{
  echo "start: $(uptime)"
  if [ "$kind" = full ]; then
    .venv/bin/python -m disttrain bench pipeline --stages 2 --repeats 15 --out "$out"
  elif [ "$kind" = large ]; then
    .venv/bin/python -m disttrain bench pipeline --stages 2 --bubble-only \
      --batch 1024 --width 1024 --repeats 9 --out "$out"
  else
    .venv/bin/python -m disttrain bench pipeline --stages 2 --bubble-only \
      --batch 1024 --width 2048 --repeats 7 --out "$out"
  fi
  echo "end: $(uptime)"
} 2>&1 | grep -v -e "Failed to initialize NumPy" -e "_conversion_method_template" | tee "$out/output.txt"
