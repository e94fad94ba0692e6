#!/usr/bin/env bash
# Parameter-server pushes per second against the shard count (bench/ps_shards.c): P threads
# push compute-free gradients of the cnn's size with AdamW to S = 1, 2, 4 shards; medians of
# REPS interleaved repetitions.  Shows what the per-shard locks buy: with one shard the pushes
# take turns on one lock, with S shards up to S workers apply at once (a pipeline).
#   bash bench/ps_shards.sh                  # P = 2 and 4; about a minute
#   WORKERS="2" REPS=7 PUSHES=400 bash bench/ps_shards.sh
# Writes bench/results/ps_shards-<date>.txt (needs `make`).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORKERS=${WORKERS:-"2 4"}
REPS=${REPS:-5}
PUSHES=${PUSHES:-200}
RESULTS=${RESULTS:-bench/results}
BIN=build/bench/ps_shards
[[ -x $BIN ]] || { echo "build $BIN first (make)" >&2; exit 1; }
# shellcheck source=bench/lib.sh
. bench/lib.sh
bench_facts ps_shards
OUT=$RESULTS/ps_shards-$STAMP.txt
{
  echo "# bash bench/ps_shards.sh (WORKERS='$WORKERS' REPS=$REPS PUSHES=$PUSHES), git $GIT_REV"
  echo "# CPU: $CPU_MODEL, $NCPU cores (lscpu: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1));" \
       "load average at the start: $LOAD1"
  for P in $WORKERS; do
    echo
    echo "## $BIN $P $REPS $PUSHES cnn"
    "$BIN" "$P" "$REPS" "$PUSHES" cnn || echo "FAILED: exit $?"
  done
} | tee "$OUT"
echo "wrote $OUT"
