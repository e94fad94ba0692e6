#!/usr/bin/env bash
# Accuracy against staleness (issue 11, "Accuracy against staleness"): the parameter server with a
# bound s on staleness, and plain async (s = infinity), with and without --staleness-lr.
#
#   bench/staleness.sh                          # cnn, 4 workers, 5 epochs, 10 runs
#   EPOCHS=1 BOUNDS="0 4 inf" EXTRA="--train-limit 6000" bench/staleness.sh   # a quick validation
#
# cnn, WORKERS (4) workers x 1 thread, global batch 128, SGD lr LR (0.05) momentum 0.9, seed 1.
# For each s in BOUNDS ("0 1 4 16 inf"), each LRMODE in "plain staleness-lr":
#   s finite:  ./build/dptrain train --staleness s [--staleness-lr] ...
#   s = inf:   ./build/dptrain train --mode async [--staleness-lr] ...
# and once the synchronous all-reduce run as the reference.  Reported per run: the final test
# accuracy (the last `epoch N/N ... test acc` line), the staleness of the last epoch as the epoch
# line gives it (mean, p50, p99, max over every push), the wall time.  At s = 0 the server is
# synchronous training (the same model as the all-reduce, to rounding); SSP sums each clock's pushes
# into one update, while plain async applies every push on its own (P times as many updates of
# batch/P samples each), so the two families differ by more than the bound.
# The machine is shared: the staleness a run sees depends on how the workers' timing interleaves,
# so it is reported, not set; the accuracies do not depend on speed except through that.
#
# Environment: WORKERS=4 EPOCHS=5 LR=0.05 BOUNDS="0 1 4 16 inf" LRMODES="plain staleness-lr"
#              REFERENCE=1 (0: skip the all-reduce run, e.g. when completing an earlier file)
#              SEED=1 EXTRA="" DPTRAIN=./build/dptrain RESULTS=bench/results
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

WORKERS=${WORKERS:-4}
EPOCHS=${EPOCHS:-5}
LR=${LR:-0.05}
BOUNDS=${BOUNDS:-0 1 4 16 inf}
LRMODES=${LRMODES:-plain staleness-lr}
REFERENCE=${REFERENCE:-1}
SEED=${SEED:-1}
EXTRA=${EXTRA:-}
DPTRAIN=${DPTRAIN:-./build/dptrain}
RESULTS=${RESULTS:-bench/results}

die() { echo "staleness: error: $*" >&2; exit 1; }
note() { echo "staleness: $*" >&2; }

[ -x "$DPTRAIN" ] || die "$DPTRAIN not found or not executable: build it first (make) or set DPTRAIN=PATH"
HELP=$("$DPTRAIN" train --help 2>&1 || true)
case $HELP in *--staleness-lr*) ;; *) die "$DPTRAIN has no --staleness-lr (rebuild: make)" ;; esac

WORK=$(mktemp -d /tmp/staleness.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
bench_facts staleness
OUT=${OUTMD%.md}.txt
# shellcheck disable=SC2206  # EXTRA is a list of flags
extra=($EXTRA)
BASE=("$DPTRAIN" train --model cnn --workers "$WORKERS" --threads 1 --batch 128 --lr "$LR" --momentum 0.9
      --epochs "$EPOCHS" --seed "$SEED" --progress lines "${extra[@]}")

{
    echo "# accuracy against staleness: cnn, $WORKERS workers x 1 thread, batch 128, lr $LR momentum 0.9, $EPOCHS epochs"
    echo "# machine: $CPU_MODEL, $NCPU CPUs; load $LOAD1; $STAMP; git $GIT_REV"
    echo "# command: ${BASE[*]} (--staleness S | --mode async) [--staleness-lr]"
    echo "# columns: bound lr_rule test_acc_percent stale_mean stale_p50 stale_p99 stale_max wall_s"
} >"$OUT"

run() { # run NAME BOUND LRRULE FLAGS...
    local name=$1 bound=$2 rule=$3
    shift 3
    local log=$WORK/$name.log t0 t1 last acc st
    note "$name: ${BASE[*]} $*"
    t0=$(date +%s.%N)
    if ! "${BASE[@]}" "$@" >"$log" 2>&1; then
        tail -3 "$log" >&2
        printf '%s %s failed - - - - %.1f\n' "$bound" "$rule" 0 | tee -a "$OUT"
        return
    fi
    t1=$(date +%s.%N)
    last=$(grep -E "^epoch $EPOCHS/$EPOCHS " "$log" | tail -1)
    acc=$(sed -nE 's/.*test acc ([0-9.]+)%.*/\1/p' <<<"$last")
    st=$(sed -nE 's/.*staleness mean ([0-9.]+) p50 ([0-9]+) p99 ([0-9]+) max ([0-9]+).*/\1 \2 \3 \4/p' <<<"$last")
    [ -n "$acc" ] || { tail -3 "$log" >&2; die "$name: no test accuracy in '$last'"; }
    printf '%s %s %s %s %.1f\n' "$bound" "$rule" "$acc" "${st:-- - - -}" "$(echo "$t1 - $t0" | bc)" | tee -a "$OUT"
}

[ "$REFERENCE" = 1 ] && run sync sync all-reduce
for s in $BOUNDS; do
    for rule in $LRMODES; do
        flags=()
        if [ "$s" = inf ]; then flags+=(--mode async); else flags+=(--staleness "$s"); fi
        [ "$rule" = staleness-lr ] && flags+=(--staleness-lr)
        run "s$s-$rule" "$s" "$rule" "${flags[@]}"
    done
done
note "raw: $OUT"
