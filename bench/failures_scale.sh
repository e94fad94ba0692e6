#!/usr/bin/env bash
# Failures at scale (issue 33, E5; docs/plan.md "16,384 workers, 419 interruptions in 54 days"):
# the failure model of dptrain simulate for the Llama 3 report's figure (a job MTBF of
# 54 x 86400 / 419 s on 16,384 workers), a 6 s step and 777,600 steps (54 days), with a
# background snapshot (C = 2 s, durable W = 60 s later) or a write in the step (C = 60 s), at
# recovery times of 600 s, 60 s and 7 s (the emulated cluster's measured recovery, docs/results.md),
# each at Young-Daly's interval; then a sweep of intervals
# for the first case.  A simulation: seconds of CPU, the same output on every machine.
#   bash bench/failures_scale.sh
# Writes bench/results/failures_scale-<date>.txt (needs `make`).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RESULTS=${RESULTS:-bench/results}
DPTRAIN=${DPTRAIN:-./build/dptrain}
[[ -x $DPTRAIN ]] || { echo "failures_scale: build $DPTRAIN first (make)" >&2; exit 1; }
# shellcheck source=lib.sh
source bench/lib.sh
bench_facts failures_scale
OUT=$RESULTS/failures_scale-$STAMP.txt
WORKER_MTBF_H=$(awk 'BEGIN { printf "%.6f", 54 * 86400 / 419 * 16384 / 3600 }')
COMMON=(--workers 16384 --steps 10 --compute-ms 6000 --mtbf-hours "$WORKER_MTBF_H" --job-steps 777600)
{
    echo "# bash bench/failures_scale.sh at $GIT_REV (a simulation: the CPU does not change the figures)"
    for snap in "--snapshot-ms 2000 --write-ms 60000" "--snapshot-ms 60000"; do
        for r in 600 60 7; do
            echo "## $DPTRAIN simulate ${COMMON[*]} $snap --recovery-s $r"
            # shellcheck disable=SC2086
            "$DPTRAIN" simulate "${COMMON[@]}" $snap --recovery-s "$r" | tail -4
        done
    done
    echo "## sweep: background snapshot, R = 600 s"
    for n in 10 20 35 50 70 140; do
        printf "snapshot every %4d steps: " "$n"
        "$DPTRAIN" simulate "${COMMON[@]}" --snapshot-ms 2000 --write-ms 60000 --recovery-s 600 \
            --snapshot-every "$n" | grep '^goodput'
    done
} | tee "$OUT"
echo "wrote $OUT" >&2
