#!/usr/bin/env bash
# What the GEMM's tiles (src/core/gemm.c: tiles from the shape alone, the same bits for any
# thread count) cost the step: samples/s of the throughput line of two builds side by side,
# interleaved, for cnn and gpt at 2 workers x 1 thread and 1 worker x 2 threads.
#   OLD=/path/to/dptrain-before NEW=build/dptrain bash bench/gemm_tiles.sh     # about 6 minutes
# Writes bench/results/gemm_tiles-<date>.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RESULTS=${RESULTS:-bench/results}
OLD=${OLD:?OLD=path of the dptrain to compare against}
NEW=${NEW:-build/dptrain}
REPS=${REPS:-3}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
DPTRAIN=$NEW
WORK=$(mktemp -d /tmp/dptrain-tiles.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
TOKENS=''
die() { echo "gemm_tiles: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }
# shellcheck source=lib.sh
source bench/lib.sh
bench_facts gemm_tiles
bench_tokens
GPT=(--model gpt:layers=4,heads=4,dim=128,ctx=64 --data "$TOKENS" --batch 32 --optim adamw --lr 1e-3 --max-steps 80)
CNN=(--model cnn --data "$DATA" --batch 128 --max-steps 120)
run() { # run BIN CONFIG: samples/s
  local opts=()
  case $2 in
  cnn_w2t1) opts=("${CNN[@]}" --workers 2 --threads 1) ;;
  cnn_w1t2) opts=("${CNN[@]}" --workers 1 --threads 2) ;;
  gpt_w2t1) opts=("${GPT[@]}" --workers 2 --threads 1) ;;
  gpt_w1t2) opts=("${GPT[@]}" --workers 1 --threads 2) ;;
  esac
  "$1" train "${opts[@]}" --epochs 1 --test-limit 200 --progress none 2>&1 | sed -n 's/^throughput: \([0-9.]*\) samples.*/\1/p'
}
: >"$WORK/raw"
for rep in $(seq "$REPS"); do
  for c in cnn_w2t1 cnn_w1t2 gpt_w2t1 gpt_w1t2; do
    echo "$c old $rep $(run "$OLD" $c)" >>"$WORK/raw"
    echo "$c new $rep $(run "$NEW" $c)" >>"$WORK/raw"
  done
done
median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
{
  echo "# OLD=$OLD NEW=$NEW bash bench/gemm_tiles.sh (REPS=$REPS) at $GIT_REV"
  echo "# CPU: $CPU_MODEL, $NCPU cores; load average at the start: $LOAD1"
  printf "%-9s %10s %10s %8s  %s\n" config old new change "all runs (old; new)"
  for c in cnn_w2t1 cnn_w1t2 gpt_w2t1 gpt_w1t2; do
    o=$(awk -v k=$c '$1 == k && $2 == "old" {print $4}' "$WORK/raw" | median)
    n=$(awk -v k=$c '$1 == k && $2 == "new" {print $4}' "$WORK/raw" | median)
    printf "%-9s %10s %10s %8s  %s; %s\n" $c "$o" "$n" "$(awk -v a="$n" -v b="$o" 'BEGIN {printf "%+.1f%%", 100 * (a / b - 1)}')" \
      "$(awk -v k=$c '$1 == k && $2 == "old" {printf "%s ", $4}' "$WORK/raw")" "$(awk -v k=$c '$1 == k && $2 == "new" {printf "%s ", $4}' "$WORK/raw")"
  done
} | tee "$RESULTS/gemm_tiles-$STAMP.txt"
echo "wrote $RESULTS/gemm_tiles-$STAMP.txt" >&2
