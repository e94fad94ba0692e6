#!/usr/bin/env bash
# Backup workers under jitter: the test accuracy they reach (issue 11, D4, "Report accuracy").
#
#   bench/backup_accuracy.sh                 # cnn, 4 workers, 5 epochs per variant
#   EPOCHS=1 EXTRA="--train-limit 6000" bench/backup_accuracy.sh   # a quick validation
#
# cnn, 4 workers x 1 thread, global batch 128, SGD lr 0.05 momentum 0.9, seed SEED.
# Variants, one after the other:
#   sync     ./build/dptrain train --workers 4 ...                       no jitter: the reference
#   jitter   ... --simulate-jitter p=0.05,ms=50                          every step waits for a stall
#   backup   ... --simulate-jitter p=0.05,ms=50 --backup-workers 1       the late rank's gradient dropped
# Reported per variant: the final test accuracy (the last `epoch N/N ... test acc` line),
# the wall time, and for backup the steps in which each rank was dropped (`dropped a/b/c/d`).
# The jitter alone changes only the timing (the arithmetic of `jitter` is that of `sync`:
# the same accuracy up to float rounding); backup's steps average over 3 of 4 shares of
# the batch when a rank is dropped, so its accuracy may move: that is what this measures.
# Throughput under jitter is measured side by side elsewhere (docs/ddp.md, "Backup workers").
#
# Environment: EPOCHS=5 SEED=1 EXTRA="" DPTRAIN=./build/dptrain RESULTS=bench/results
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

EPOCHS=${EPOCHS:-5}
SEED=${SEED:-1}
EXTRA=${EXTRA:-}
DPTRAIN=${DPTRAIN:-./build/dptrain}
RESULTS=${RESULTS:-bench/results}

die() { echo "backup_accuracy: error: $*" >&2; exit 1; }
note() { echo "backup_accuracy: $*" >&2; }

[ -x "$DPTRAIN" ] || die "$DPTRAIN not found or not executable: build it first (make) or set DPTRAIN=PATH"
HELP=$("$DPTRAIN" train --help 2>&1 || true)
case $HELP in *--backup-workers*) ;; *) die "$DPTRAIN has no --backup-workers (rebuild: make)" ;; esac

WORK=$(mktemp -d /tmp/backup_accuracy.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
bench_facts backup_accuracy
OUT=${OUTMD%.md}.txt
# shellcheck disable=SC2206  # EXTRA is a list of flags
extra=($EXTRA)
BASE=("$DPTRAIN" train --model cnn --workers 4 --threads 1 --batch 128 --lr 0.05 --momentum 0.9
      --epochs "$EPOCHS" --seed "$SEED" --progress lines "${extra[@]}")
JIT=(--simulate-jitter p=0.05,ms=50)

{
    echo "# backup workers under jitter: test accuracy, cnn, 4 workers x 1 thread, batch 128, $EPOCHS epochs"
    echo "# machine: $CPU_MODEL, $NCPU CPUs; load $LOAD1; $STAMP; git $GIT_REV"
    echo "# command: ${BASE[*]} [${JIT[*]} [--backup-workers 1]]"
    echo "# variant test_acc_percent wall_s dropped_steps_per_rank(last epoch)"
} >"$OUT"

for v in sync jitter backup; do
    flags=()
    [ "$v" = sync ] || flags+=("${JIT[@]}")
    [ "$v" = backup ] && flags+=(--backup-workers 1)
    log=$WORK/$v.log
    note "$v: ${BASE[*]} ${flags[*]}"
    t0=$(date +%s.%N)
    "${BASE[@]}" "${flags[@]}" >"$log" 2>&1 || { tail -5 "$log" >&2; die "$v failed"; }
    t1=$(date +%s.%N)
    last=$(grep -E "^epoch $EPOCHS/$EPOCHS " "$log" | tail -1)
    [ -n "$last" ] || { tail -5 "$log" >&2; die "$v: no 'epoch $EPOCHS/$EPOCHS' line"; }
    acc=$(sed -nE 's/.*test acc ([0-9.]+)%.*/\1/p' <<<"$last")
    drop=$(sed -nE 's/.*dropped ([0-9/]+).*/\1/p' <<<"$last")
    [ -n "$acc" ] || die "$v: no test accuracy in '$last'"
    printf '%s %s %.1f %s\n' "$v" "$acc" "$(echo "$t1 - $t0" | bc)" "${drop:--}" | tee -a "$OUT"
done
note "raw: $OUT"
