#!/usr/bin/env bash
# Issue 51's start-up check: N jobs of `disttrain train --workers 4 --max-steps 3`, back to
# back; counts exits other than 0 and the jobs whose output says the group was formed again
# ("forming ... again (try k of 3)", comm/forming.py). Run it beside `make test` for the
# issue's "beside the suite".
#   bash benchmarks/startup_jobs.sh 200 /tmp/startup > benchmarks/results/startup_jobs.txt
set -u
n=${1:-200}
out=${2:-/tmp/startup-jobs}
bin=$(dirname "$0")/../.venv/bin
mkdir -p "$out"
failed=0 retried=0
for i in $(seq "$n"); do
    "$bin/disttrain" train --workers 4 --max-steps 3 --no-progress --out "$out/run" --overwrite \
        > "$out/last.out" 2> "$out/last.err"
    rc=$?
    if grep -q "again (try" "$out/last.err"; then
        retried=$((retried + 1)); echo "job $i: retried (exit $rc)"; grep "again (try" "$out/last.err"
    fi
    if [ "$rc" -ne 0 ]; then
        failed=$((failed + 1)); echo "job $i: exit $rc"; tail -3 "$out/last.err"
    fi
    if [ $((i % 20)) -eq 0 ]; then echo "$(date -u +%H:%M:%S) $i jobs, load $(cut -d' ' -f1-3 /proc/loadavg)"; fi
done
echo "jobs $n, exit 0: $((n - failed)), failed: $failed, retried: $retried"
