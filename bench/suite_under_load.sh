#!/usr/bin/env bash
# The quick suite RUNS times in a row (default 3) with a CPU-bound `dptrain train` (cnn, 2
# workers, on both cores) beside it the whole time: the timing-dependent tests must hold
# under load (issue 27, R6).  Run it on a clone of its own; about 20-40 minutes.
#   bash bench/suite_under_load.sh
# Writes bench/results/suite_under_load-<date>.txt: per run its exit, time, totals, load
# average and any FAIL lines.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUNS=${RUNS:-3}
RESULTS=${RESULTS:-bench/results}
# shellcheck source=lib.sh
source bench/lib.sh
bench_facts suite_under_load
OUT=$RESULTS/suite_under_load-$STAMP.txt
make -j2 >/dev/null 2>&1 || { echo "make failed" >&2; exit 1; }
W=$(mktemp -d /tmp/dptrain-load.XXXXXX)
( while :; do ./build/dptrain train --model cnn --workers 2 --epochs 50 --train-limit 20000 --progress none \
    --out "$W/load" --overwrite >/dev/null 2>&1; done ) &
LOAD=$!
trap 'kill $LOAD 2>/dev/null; pkill -f "$W/load"; rm -rf "$W"' EXIT
{
  echo "# bash bench/suite_under_load.sh (RUNS=$RUNS) at $GIT_REV"
  echo "# CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1"
  echo "# beside it: dptrain train --model cnn --workers 2 in a loop"
  for i in $(seq "$RUNS"); do
    t0=$(date +%s)
    QUICK=1 bash scripts/test.sh >"$W/run$i.log" 2>&1; rc=$?
    echo "run $i: exit $rc, $(( $(date +%s) - t0 )) s, $(tail -1 "$W/run$i.log"), load $(cut -d' ' -f1-3 /proc/loadavg)"
    grep "^FAIL" "$W/run$i.log"
  done
} | tee "$OUT"
echo "saved: $OUT" >&2
