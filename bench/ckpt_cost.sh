#!/usr/bin/env bash
# What frequent checkpoints cost the step (issue 33, E2: under 2% at --ckpt-every-steps 50):
# cnn (Fashion-MNIST, batch 128) and gpt:layers=4,heads=4,dim=128,ctx=64 (the fortunes tokens,
# batch 32, AdamW), 2 workers, STEPS steps of one epoch, with no step checkpoint ("off") and
# with --ckpt-every-steps N for N in NS, written in the background (the default) and in the
# step (--ckpt-sync), REPS repetitions interleaved.  The figure is the CLI's `throughput:`
# line: samples over the wall time from the 5th step's end to the last step's, so a
# checkpoint written between two steps counts; the cost is 1 - median / off's median.
#   bash bench/ckpt_cost.sh                         # about 8 minutes
#   MODELS=cnn NS="10 50" REPS=5 bash bench/ckpt_cost.sh
#   EXTRA="--zero 2" bash bench/ckpt_cost.sh        # ZeRO: each worker's shards written in place
# Writes bench/results/ckpt_cost-<date>.txt (needs `make`, the data of scripts/install-deps.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
REPS=${REPS:-3}
MODELS=${MODELS:-cnn gpt}
NS=${NS:-10 50 200}
STEPS=${STEPS:-205}
WORKERS=${WORKERS:-2}
EXTRA=${EXTRA:-}   # more train options for every run (words)
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
RESULTS=${RESULTS:-bench/results}
DPTRAIN=${DPTRAIN:-./build/dptrain}
TOKENS=${TOKENS:-}
GPT=gpt:layers=4,heads=4,dim=128,ctx=64
WORK=$(mktemp -d /tmp/dptrain-ckpt.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
die() { echo "ckpt_cost: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }
[[ -x $DPTRAIN ]] || die "build $DPTRAIN first (make)"
# shellcheck source=lib.sh
source bench/lib.sh
bench_facts ckpt_cost
OUT=$RESULTS/ckpt_cost-$STAMP.txt
[[ $MODELS == *gpt* ]] && bench_tokens

# run_one NAME REP, NAME = MODEL/off, MODEL/bgN or MODEL/syncN: one run, its samples/s into RAW
run_one() {
    local model=${1%/*} how=${1#*/} opts=() extra=()
    case $model in
    cnn) opts=(--model cnn --data "$DATA" --batch 128 --lr 0.05 --momentum 0.9 --test-limit 500) ;;
    gpt) opts=(--model "$GPT" --data "$TOKENS" --batch 32 --optim adamw --lr 1e-3) ;;
    esac
    case $how in
    off) ;;
    bg*) extra=(--ckpt-every-steps "${how#bg}") ;;
    sync*) extra=(--ckpt-every-steps "${how#sync}" --ckpt-sync) ;;
    esac
    rm -rf "$WORK/run"
    # shellcheck disable=SC2086  # EXTRA: words
    "$DPTRAIN" train "${opts[@]}" "${extra[@]}" $EXTRA --workers "$WORKERS" --threads 1 --epochs 1 --max-steps "$STEPS" \
        --progress none --out "$WORK/run" >"$WORK/log" 2>&1 || { cat "$WORK/log" >&2; die "$model $how failed"; }
    local sps
    sps=$(dptrain_sps "$WORK/log")
    [[ -n $sps ]] || die "$model $how: no throughput line"
    echo "$1 $2 $sps $(stat -c %s "$WORK/run/checkpoint.bin")" >>"$WORK/raw"
}

names=()
for m in $MODELS; do
    names+=("$m/off")
    for n in $NS; do names+=("$m/bg$n" "$m/sync$n"); done
done
: >"$WORK/raw"
bench_interleaved "$REPS" "${names[@]}"

median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
{
    echo "# bash bench/ckpt_cost.sh (REPS=$REPS MODELS=\"$MODELS\" NS=\"$NS\" STEPS=$STEPS WORKERS=$WORKERS EXTRA=\"$EXTRA\") at $GIT_REV"
    echo "# CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1"
    echo "# samples/s: the throughput line (steps 6..$STEPS, wall time, checkpoints between steps included);"
    echo "# cost = 1 - median / off's median; bg: the background writer (default), sync: --ckpt-sync"
    printf "%-5s %-9s %10s %7s %10s  %s\n" model run median cost ckpt_bytes "all runs (samples/s)"
    for m in $MODELS; do
        off=$(awk -v k="$m/off" '$1 == k {print $3}' "$WORK/raw" | median)
        for name in "${names[@]}"; do
            [[ ${name%/*} == "$m" ]] || continue
            all=$(awk -v k="$name" '$1 == k {printf "%s ", $3}' "$WORK/raw")
            med=$(awk -v k="$name" '$1 == k {print $3}' "$WORK/raw" | median)
            bytes=$(awk -v k="$name" '$1 == k {print $4}' "$WORK/raw" | head -1)
            cost=$(awk -v a="$med" -v b="$off" 'BEGIN { printf "%+.1f%%", 100 * (1 - a / b) }')
            printf "%-5s %-9s %10s %7s %10s  %s\n" "$m" "${name#*/}" "$med" "$cost" "$bytes" "$all"
        done
    done
} | tee "$OUT"
echo "wrote $OUT" >&2
