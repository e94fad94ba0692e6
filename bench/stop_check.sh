#!/usr/bin/env bash
# What the clean stop costs under mpirun (issue 27, R2): a step of mlp on 2 processes with and
# without the per-step 1-double all-reduce that carries the stop request, side by side in one
# process (bench/stop_check.c), as medians over REPS repetitions, and the bare all-reduce's
# latency.
#   bash bench/stop_check.sh                    # about 1 minute
#   REPS=9 STEPS=300 MODEL=mlp bash bench/stop_check.sh
# Writes bench/results/stop_check-<date>.txt (needs `make`, Open MPI).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REPS=${REPS:-9}
STEPS=${STEPS:-300}
MODEL=${MODEL:-mlp}
RESULTS=${RESULTS:-bench/results}
BIN=build/bench/stop_check
[[ -x $BIN ]] || { echo "build $BIN first (make; needs MPI)" >&2; exit 1; }
# shellcheck source=lib.sh
source bench/lib.sh
bench_facts stop_check
OUT=$RESULTS/stop_check-$STAMP.txt
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
{
  echo "# bash bench/stop_check.sh (REPS=$REPS STEPS=$STEPS MODEL=$MODEL) at $GIT_REV"
  echo "# CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1"
  echo "# mpirun -np 2 --mca btl self,vader $BIN $REPS $STEPS $MODEL"
  echo "# ms_step: milliseconds per step over steps 10..10+STEPS; off: no stop flag, on: the"
  echo "# flag set (one 1-double all-reduce per step); the order alternates per repetition"
  mpirun -np 2 --mca btl self,vader "$BIN" "$REPS" "$STEPS" "$MODEL"
} 2>&1 | tee "$OUT"
echo "saved: $OUT" >&2
