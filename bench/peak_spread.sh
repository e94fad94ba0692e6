#!/usr/bin/env bash
# The spread of the measured fp32 peak (the MFU's denominator, src/core/peak.c) from one launch
# of dptrain to the next (issue 32, S1): N short runs, each measuring the peak at its start; the
# peaks sorted, their min, median and max.
#   bash bench/peak_spread.sh            # N=15, about 20 s
# Writes bench/results/peak_spread-<date>.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RESULTS=${RESULTS:-bench/results}
DPTRAIN=${DPTRAIN:-./build/dptrain}
N=${N:-15}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
# shellcheck disable=SC2034 # (lib.sh reads $ROOT)
ROOT=$PWD
# shellcheck source=lib.sh
source bench/lib.sh
bench_start peak_spread
for _ in $(seq "$N"); do
    "$DPTRAIN" train --model mlp --data "$DATA" --max-steps 8 --epochs 1 --train-limit 2000 --test-limit 100 \
        --progress none 2>&1 | sed -n 's/.*of [0-9]* x \([0-9.]*\) GFLOP.*/\1/p'
done | sort -g >"$WORK/peaks"
{
    echo "# bash bench/peak_spread.sh (N=$N) at $GIT_REV"
    echo "# CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1"
    echo "peaks (GFLOP/s, sorted): $(tr '\n' ' ' <"$WORK/peaks")"
    awk '{a[NR] = $1} END {if (NR) printf "min %s, median %s, max %s: max / min - 1 = %.1f%%\n", a[1], a[int((NR + 1) / 2)], a[NR], 100 * (a[NR] / a[1] - 1)}' "$WORK/peaks"
} | tee "$RESULTS/peak_spread-$STAMP.txt"
